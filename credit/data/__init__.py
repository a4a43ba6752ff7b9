"""Data layer: ERA5-layout dataset reader, synthetic generator and data-parallel sampler."""

from .catalog import DataError
from .dataset import ERA5Dataset, VariableSpec
from .generate import generate_dataset
from .sampler import DPShardedBatchSampler

__all__ = ["DPShardedBatchSampler", "DataError", "ERA5Dataset", "VariableSpec", "generate_dataset"]
