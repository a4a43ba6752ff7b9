"""Data layer: ERA5-layout dataset reader, synthetic generator, data-parallel sampler, and
the adapter from `data.*` to datasets and the model's data layout."""

from .buffers import recycled
from .catalog import DataError
from .dataset import ERA5Dataset, VariableSpec
from .from_config import build_dataset, ensure_dataset, model_layout, role_files, variable_spec
from .generate import generate_dataset
from .latitude import latitude_weights
from .sampler import DPShardedBatchSampler, collate_samples, evenly_spaced

__all__ = [
    "DPShardedBatchSampler",
    "DataError",
    "ERA5Dataset",
    "VariableSpec",
    "build_dataset",
    "collate_samples",
    "ensure_dataset",
    "evenly_spaced",
    "generate_dataset",
    "latitude_weights",
    "model_layout",
    "recycled",
    "role_files",
    "variable_spec",
]
