"""The training loss: an elementwise error (CREDIT's deterministic losses) on normalized
variables, weighted by latitude and per variable, averaged.

The error functions are CREDIT's (`credit/losses`), which its trainer calls as
`loss(target, prediction)`: mse, mae and huber are torch's; logcosh, xtanh and xsigmoid
add 1e-12 to target - prediction; msle compares log(|x| + 1). mse keeps the expression it
always had here, (prediction - target)^2, the same bits as CREDIT's (target - prediction)^2.

Two ways to combine the weighted errors (`trainer.loss.combine`): the mean over every channel
(CREDIT's flat losses), or each variable's mean over its channels and then the mean over
variables (CREDIT's gen2 BaseLoss); both are one mean over (batch, channel, lat, lon) with
per-channel weights (`channel_weights`, `variable_mean_weights`, or learned ones:
`credit.train.learned_variance`). With `space="physical"` the
error is taken after de-normalising prediction and target (x * std + mean per channel, the
inverse of CREDIT's scaler), as BaseLoss scores its postblocks' physical units; a computed
variable (CREDIT's geopotential postblock, `credit.interop.geopotential`) is then appended to
both as further channels and scored as one more variable (BaseLoss's computed diagnostics).
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from credit.data.target_statistics import as_fields, channel_variance
from credit.train.deterministic import sample_sums
from credit.train.ensemble import ENSEMBLE_FUNCTIONS, ensemble_error
from credit.train.learned_variance import LearnedVariance

log = logging.getLogger(__name__)


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


def variable_mean_weights(
    channel_variables: Sequence[str], variable_weights: Mapping[str, Any], normalize: bool = True,
    channel_variance: Sequence[float] | None = None,
) -> torch.Tensor:
    """Per-channel weights that make one mean over all channels CREDIT's BaseLoss combination:
    the mean over variables of W_v times the variable's own mean error. W_v is the variable's
    weight (default 1), divided by its variance (the mean over its channels of
    `channel_variance`) when that is given, and with `normalize` divided by the mean of the W_v."""
    names = list(dict.fromkeys(channel_variables))
    counts = {v: channel_variables.count(v) for v in names}
    weights = {}
    for v in names:
        given = variable_weights.get(v, 1.0)
        if not isinstance(given, (int, float)):
            raise ValueError(f"trainer.loss.variable_weights.{v}: {given}; with trainer.loss.combine=variables a "
                             "variable has one weight")
        weights[v] = float(given)
    if channel_variance is not None:
        variance = torch.as_tensor(list(channel_variance), dtype=torch.float64)
        for v in names:
            rows = [i for i, c in enumerate(channel_variables) if c == v]
            if not torch.isnan(variance[rows]).any():  # NaN: none known, the weight stays (BaseLoss)
                weights[v] /= max(float(variance[rows].mean()), 1e-12)  # BaseLoss's floor
    if normalize:
        mean = sum(weights.values()) / len(weights)
        if mean > 0:
            weights = {v: w / mean for v, w in weights.items()}
    if sum(weights.values()) <= 0:
        raise ValueError("trainer.loss.variable_weights leaves every output variable at weight 0")
    scale = len(channel_variables) / len(names)
    return torch.tensor([weights[v] * scale / counts[v] for v in channel_variables], dtype=torch.float64).float()


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
    """mean over (batch, channel, lat, lon) of w_lat * w_channel * error(prediction, target);
    with `physical=(std, mean)` (per channel (C,), or per channel and grid point (C, H, W)), the
    error of x * std + mean of both, through `inverse` (the data's pointwise output blocks) if given;
    `channel_errors` gives some channels another (function, huber delta); `learned` multiplies
    the channel weights by its exp(-s_v) and adds its penalty to the mean. `computed` maps the
    physical channels to further ones (a computed variable), appended before the error."""

    def __init__(self, lat_weights: torch.Tensor, chan_weights: torch.Tensor, function: str = "mse",
                 huber_delta: float = 1.0, physical: tuple[torch.Tensor, torch.Tensor] | None = None,
                 crps_alpha: float = 1.0, inverse: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 channel_errors: Mapping[tuple[str, float], Sequence[int]] | None = None,
                 learned: LearnedVariance | None = None,
                 computed: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        super().__init__()
        self.learned = learned
        self.computed = computed
        if function not in ERRORS and function not in ENSEMBLE_FUNCTIONS:
            raise ValueError(f"loss function {function!r}: one of {sorted(ERRORS) + list(ENSEMBLE_FUNCTIONS)}")
        self.function, self.huber_delta, self.crps_alpha = function, huber_delta, crps_alpha
        self.register_buffer("lat_weights", lat_weights.view(1, 1, -1, 1), persistent=False)
        self.register_buffer("chan_weights", chan_weights.view(1, -1, 1, 1), persistent=False)
        self.physical = physical is not None
        self.inverse = inverse
        # (function, huber delta) -> the channels scored with it instead of `function` (BaseLoss's overrides)
        self.channel_errors = {key: list(rows) for key, rows in (channel_errors or {}).items() if rows}
        if physical is not None:
            for name, stat in zip(("std", "mean"), physical):
                stat = torch.as_tensor(stat, dtype=torch.float32)
                self.register_buffer(name, stat.view(1, -1, 1, 1) if stat.ndim == 1 else stat.unsqueeze(0),
                                     persistent=False)

    def weighted_error(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The weighted elementwise error (B, C, lat, lon), before any sum (an ensemble's
        `prediction`: (B x members, C, lat, lon))."""
        error = self.error(prediction, target) * self.lat_weights
        if self.learned is not None:
            return error * self.learned.channel_weights().view(1, -1, 1, 1)
        return error * self.chan_weights

    def sample_sums(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Deterministic mode: (B,) per-sample sums of the weighted error by the fixed trees."""
        if self.learned is None:
            return sample_sums(prediction, target, self.weighted_error)
        scaled = self.error(prediction, target) * self.lat_weights * self.learned.channel_scale.view(1, -1, 1, 1)
        return self.learned.sample_sums(scaled)

    def sample_mean(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Deterministic mode's validation loss of one sample: its sum by the fixed trees over
        its elements (plus the learned weights' penalty). torch's `mean` reduces in an order set
        by the intra-op thread count, so one process on several cores and torchrun's one-thread
        ranks would report other bits."""
        mean = self.sample_sums(prediction, target)[0] / self.elements(target[0])
        return mean if self.learned is None else mean + self.learned.penalty()

    def elements(self, sample: torch.Tensor) -> int:
        """The errors one target sample (C, lat, lon) is scored by: its elements, and those of
        the computed channels."""
        return sample.numel() // sample.shape[0] * self.chan_weights.shape[1]

    def error(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The unweighted elementwise error (B, C, lat, lon); in physical space, of the
        de-normalised values after the output blocks."""
        if self.physical:  # float32 as BaseLoss scores it (physical magnitudes overflow half precision)
            prediction = prediction.float() * self.std + self.mean
            target = target.float() * self.std + self.mean
            if self.inverse is not None:  # CREDIT's exp/square postblocks, on prediction and target twin
                prediction, target = self.inverse(prediction), self.inverse(target)
            if self.computed is not None:  # BaseLoss's computed diagnostics: from prediction and target twin
                prediction = torch.cat([prediction, self.computed(prediction)], dim=-3)
                target = torch.cat([target, self.computed(target)], dim=-3)
        if self.function in ENSEMBLE_FUNCTIONS:
            error = ensemble_error(self.function, prediction, target, self.crps_alpha)
        elif self.channel_errors:
            error = self._per_channel_error(prediction, target)
        else:
            error = ERRORS[self.function](prediction, target, self.huber_delta)
        return error

    def _per_channel_error(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Each channel's error with its own (function, delta): the overridden channels' groups,
        the rest with `function`; each group computed on its channels alone."""
        overridden = {c for rows in self.channel_errors.values() for c in rows}
        groups = {(self.function, self.huber_delta): [c for c in range(prediction.shape[1]) if c not in overridden]}
        for key, rows in self.channel_errors.items():
            groups.setdefault(key, []).extend(rows)
        error = torch.zeros_like(prediction)
        for (function, delta), rows in groups.items():
            if rows:
                index = torch.tensor(sorted(rows), device=prediction.device)
                part = ERRORS[function](prediction.index_select(1, index), target.index_select(1, index), delta)
                error = error.index_copy(1, index, part)
        return error

    def forward(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = self.weighted_error(prediction, target).mean()
        return loss if self.learned is None else loss + self.learned.penalty()

    def for_validation(self) -> "WeightedLoss":
        """This loss with learned weights frozen at their present values (CREDIT validates with
        the weights of the first step); itself when there are none."""
        if self.learned is None:
            return self
        frozen = copy.copy(self)
        frozen._modules = dict(self._modules)
        frozen.learned = self.learned.frozen()
        return frozen


def training_loss(loss: Any, channel_variables: Sequence[str], lat_weights: torch.Tensor,
                  target_std: np.ndarray, target_mean: np.ndarray,
                  output_inverse: Callable[[torch.Tensor], torch.Tensor] | None = None,
                  computed: Any = None) -> WeightedLoss:
    """The loss `trainer.loss` (its schema: credit/config/schema.py LossConfig) describes, for
    output channels of `channel_variables` whose data statistics are `target_std`, `target_mean`
    (credit/data/target_statistics.py: per channel, or per channel and grid point) and, in
    physical space, whose pointwise output blocks are `output_inverse`; `computed` (physical
    space, combine=variables) adds the channels of a computed variable (its `name`, `levels`
    channels), weighted as BaseLoss weighs a variable its scaler file has no statistics for."""
    std = torch.as_tensor(as_fields(target_std), dtype=torch.float32)
    mean = torch.as_tensor(as_fields(target_mean), dtype=torch.float32)
    if not loss.latitude_weighting:
        lat_weights = torch.ones_like(lat_weights)
    learned = None
    if loss.learnable_variance:  # s_v start at the log-variance of the values scored: normalized ones have 1
        physical = loss.space == "physical"
        learned = LearnedVariance(channel_variables, loss.variable_weights,
                                  channel_variance(std.double().numpy()) if physical else [1.0] * len(channel_variables))
        weights = learned.channel_scale
    elif loss.combine == "variables":
        variance = channel_variance(std.double().numpy()) if loss.inverse_variance else None
        scored = list(channel_variables)
        if computed is not None:
            scored += [computed.name] * computed.levels
            if variance is not None:  # NaN, no scaler statistics: BaseLoss keeps the manual weight (default 1)
                variance = [*variance, *[float(computed.variance)] * computed.levels]
                if math.isnan(computed.variance):
                    log.warning(f"{computed.name} (computed, data.credit.geopotential) has no statistics in the "
                                "scaler file: its inverse-variance weight is its manual one (default 1.0), as "
                                "CREDIT's BaseLoss falls back")
        weights = variable_mean_weights(scored, loss.variable_weights, loss.normalize_variable_weights, variance)
    else:
        weights = channel_weights(channel_variables, loss.variable_weights, loss.normalize_variable_weights)
    channel_errors: dict[tuple[str, float], list[int]] = {}
    for name, override in loss.overrides.items():
        rows = [i for i, v in enumerate(channel_variables) if v == name]
        channel_errors.setdefault((str(override["function"]), float(override.get("huber_delta", 1.0))), []).extend(rows)
    return WeightedLoss(lat_weights, weights, loss.function, loss.huber_delta,
                        physical=(std, mean) if loss.space == "physical" else None, crps_alpha=loss.crps_alpha,
                        inverse=output_inverse if loss.space == "physical" else None, channel_errors=channel_errors,
                        learned=learned, computed=computed if loss.space == "physical" else None)
