"""The climatology that ACC anomalies and the climatology forecast are measured against.

Defined as the time mean, per grid point and channel, of the training period
(`data.train_period`), estimated from `rollout.climatology_samples` evenly spaced times.
It keeps the geographic pattern (pole-to-equator gradients, land and sea, orography) that a
single global mean per level (`mean.nc`) would leave in every anomaly, at the cost of one
pass over a few dozen training times. It has no seasonal cycle: over long periods the
anomalies of real ERA5 include the seasons, which inflates ACC against a day-of-year
climatology.
"""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import DictConfig

from credit.data import build_dataset, evenly_spaced
from credit.data.target_statistics import as_fields


def training_climatology(data: DictConfig, samples: int) -> np.ndarray:
    """(C_target, H, W) float64 mean of the target channels in physical units over `samples`
    evenly spaced times of data.train_period (every time when fewer are available)."""
    dataset = build_dataset(data, "train_period")
    total: np.ndarray | None = None
    indices = evenly_spaced(samples, len(dataset))
    for index in indices:
        frame = dataset[index]["target"][0].double().numpy()
        if dataset.normalize:
            frame = frame * as_fields(dataset.target_std) + as_fields(dataset.target_mean)
        if dataset.output_inverse is not None:  # the mean of the fields, not of their logs
            frame = dataset.output_inverse(torch.from_numpy(frame)).numpy()
        total = frame if total is None else total + frame
    mean = total / len(indices)
    dataset.close()
    return mean
