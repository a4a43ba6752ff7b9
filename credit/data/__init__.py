"""Data layer: ERA5-layout dataset reader, synthetic generator, data-parallel sampler, and
the adapter from `data.*` to datasets and the model's data layout.

The adapter (`from_config`) also builds CREDIT's datasets (`credit.interop`), which read files
through this package's catalog; it is imported on first use of one of its names, so that
importing `credit.interop` first (as a process unpickling a CREDIT dataset does: a DataLoader
worker started by spawn or forkserver) does not come back into `credit.interop` half-made.
"""

from importlib import import_module

from .buffers import recycled
from .catalog import DataError
from .dataset import ERA5Dataset, VariableSpec
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

_FROM_CONFIG = ("build_dataset", "ensure_dataset", "model_layout", "role_files", "variable_spec")


def __getattr__(name: str):
    if name in _FROM_CONFIG:
        return getattr(import_module(".from_config", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
