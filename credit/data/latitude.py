"""Area weights of a regular latitude-longitude grid (the training loss and the skill scores)."""

from __future__ import annotations

import numpy as np
import torch


def latitude_weights(latitude_deg: np.ndarray) -> torch.Tensor:
    """cos(latitude) normalised to mean 1, so a grid cell counts in proportion to its area."""
    weights = np.cos(np.deg2rad(np.asarray(latitude_deg, dtype=np.float64)))
    weights = np.clip(weights, 0.0, None)
    return torch.as_tensor(weights / weights.mean(), dtype=torch.float32)
