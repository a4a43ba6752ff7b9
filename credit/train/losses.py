"""Latitude-weighted MSE on normalized variables, with per-variable weights."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn


def channel_weights(
    channel_variables: Sequence[str], variable_weights: Mapping[str, float]
) -> torch.Tensor:
    """One weight per output channel from per-variable weights (default 1), mean 1."""
    weights = torch.tensor([float(variable_weights.get(v, 1.0)) for v in channel_variables])
    if weights.sum() <= 0:
        raise ValueError("trainer.loss.variable_weights leaves every output variable at weight 0")
    return weights / weights.mean()


class WeightedMSE(nn.Module):
    """mean over (batch, channel, lat, lon) of w_lat * w_channel * (pred - target)^2."""

    def __init__(self, lat_weights: torch.Tensor, chan_weights: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("lat_weights", lat_weights.view(1, 1, -1, 1), persistent=False)
        self.register_buffer("chan_weights", chan_weights.view(1, -1, 1, 1), persistent=False)

    def weight(self, squared: torch.Tensor) -> torch.Tensor:
        """The per-element weights applied to squared errors (B, C, lat, lon)."""
        return squared * self.lat_weights * self.chan_weights

    def forward(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.weight((prediction - target) ** 2).mean()
