"""The training loss: an elementwise error (CREDIT's deterministic losses) on normalized
variables, weighted by latitude and per variable, averaged.

The error functions are CREDIT's (`credit/losses`), which its trainer calls as
`loss(target, prediction)`: mse, mae and huber are torch's; logcosh, xtanh and xsigmoid
add 1e-12 to target - prediction; msle compares log(|x| + 1). mse keeps the expression it
always had here, (prediction - target)^2, the same bits as CREDIT's (target - prediction)^2.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def channel_weights(
    channel_variables: Sequence[str], variable_weights: Mapping[str, Any], normalize: bool = True
) -> torch.Tensor:
    """One weight per output channel from per-variable weights (default 1): a number, or a
    list with one weight per channel of that variable (an upper-air variable's levels, in
    order, as CREDIT gives them). `normalize` divides them by their mean."""
    counts = {v: channel_variables.count(v) for v in dict.fromkeys(channel_variables)}
    seen: dict[str, int] = {}
    weights = []
    for v in channel_variables:
        given = variable_weights.get(v, 1.0)
        if isinstance(given, (int, float)):
            weights.append(float(given))
        else:
            given = list(given)
            if len(given) != counts[v]:
                raise ValueError(f"trainer.loss.variable_weights.{v} has {len(given)} values; {v} has "
                                 f"{counts[v]} output channels (one per level)")
            weights.append(float(given[seen.get(v, 0)]))
        seen[v] = seen.get(v, 0) + 1
    weights = torch.tensor(weights, dtype=torch.float64)
    if weights.sum() <= 0:
        raise ValueError("trainer.loss.variable_weights leaves every output variable at weight 0")
    return (weights / weights.mean() if normalize else weights).float()


def _logcosh(prediction: torch.Tensor, target: torch.Tensor, delta: float) -> torch.Tensor:
    return torch.log(torch.cosh(target - prediction + 1e-12))


def _xtanh(prediction: torch.Tensor, target: torch.Tensor, delta: float) -> torch.Tensor:
    error = target - prediction + 1e-12
    return error * torch.tanh(error)


def _xsigmoid(prediction: torch.Tensor, target: torch.Tensor, delta: float) -> torch.Tensor:
    error = target - prediction + 1e-12
    return 2 * error / (1 + torch.exp(-error)) - error


ERRORS = {
    "mse": lambda prediction, target, delta: (prediction - target) ** 2,
    "mae": lambda prediction, target, delta: (target - prediction).abs(),
    "huber": lambda prediction, target, delta: F.huber_loss(target, prediction, reduction="none", delta=delta),
    "logcosh": _logcosh,
    "xtanh": _xtanh,
    "xsigmoid": _xsigmoid,
    "msle": lambda prediction, target, delta: (torch.log(target.abs() + 1) - torch.log(prediction.abs() + 1)) ** 2,
}
"""`trainer.loss.function`: the elementwise error of each, CREDIT's arithmetic."""


class WeightedLoss(nn.Module):
    """mean over (batch, channel, lat, lon) of w_lat * w_channel * error(prediction, target)."""

    def __init__(self, lat_weights: torch.Tensor, chan_weights: torch.Tensor, function: str = "mse",
                 huber_delta: float = 1.0) -> None:
        super().__init__()
        if function not in ERRORS:
            raise ValueError(f"loss function {function!r}: one of {sorted(ERRORS)}")
        self.function, self.huber_delta = function, huber_delta
        self.register_buffer("lat_weights", lat_weights.view(1, 1, -1, 1), persistent=False)
        self.register_buffer("chan_weights", chan_weights.view(1, -1, 1, 1), persistent=False)

    def weighted_error(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The weighted elementwise error (B, C, lat, lon), before any sum."""
        return ERRORS[self.function](prediction, target, self.huber_delta) * self.lat_weights * self.chan_weights

    def forward(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.weighted_error(prediction, target).mean()
