"""The shape of a dataset's `target_mean` and `target_std`, the statistics that de-normalise
the output channels: one value per channel, shape (C,), or, when a channel is scaled per grid
point (CREDIT's bridgescaler `spatial_variables`), one per channel and grid point, (C, H, W).
Every consumer (losses, validation, forecasts, climatology) takes them through `as_fields`,
so the two shapes broadcast alike against (…, C, H, W) tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def as_fields(stat: np.ndarray | Sequence[float]) -> np.ndarray:
    """float64 (C, 1, 1) of per-channel statistics, or the (C, H, W) of per-grid-point ones."""
    values = np.asarray(stat, dtype=np.float64)
    if values.ndim == 1:
        return values[:, None, None]
    if values.ndim != 3:
        raise ValueError(f"target statistics of shape {values.shape}: (channels,) or (channels, lat, lon)")
    return values


def varies_over_grid(stat: np.ndarray | Sequence[float]) -> bool:
    """True when some channel's statistic is one per grid point."""
    return np.asarray(stat).ndim == 3 and np.asarray(stat).shape[1:] != (1, 1)


def channel_variance(std: np.ndarray | Sequence[float]) -> np.ndarray:
    """(C,) float64 variance of each channel: std², averaged over the grid where it varies
    there (CREDIT's BaseLoss takes a scaler's mean variance over its channels)."""
    return (as_fields(std) ** 2).mean(axis=(1, 2))
