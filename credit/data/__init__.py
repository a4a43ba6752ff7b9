"""Data layer: ERA5-layout dataset reader, synthetic generator and data-parallel sampler."""

from .generate import generate_dataset

__all__ = ["generate_dataset"]
