"""Validation on held-out times: RMSE per variable for the model and for persistence, at the
validation lead (`data.valid_forecast_len` autoregressive steps; the last one is scored, as
CREDIT's trainers score it). An ensemble's members are forecast as in training (inputs
repeated per member, CREDIT's validation too); its RMSE is the ensemble mean's, and
`spread_<var>` is the members' spread (the unbiased variance over members, pooled as the RMSE)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import math

import numpy as np
import torch
from torch import nn

from credit.data.target_statistics import as_fields
from credit.models.dropout import dropout_step
from credit.train.ensemble import with_members
from credit.train.forecast import forecast_steps


VALIDATION_STEP = -1  # the step key of validation's randomness (training's steps are >= 0)


def output_channel_variables(
    upper_air: Sequence[str], levels: Sequence[float], surface: Sequence[str], diagnostic: Sequence[str]
) -> list[str]:
    """The variable each output channel belongs to, in the dataset's channel order."""
    return [v for v in upper_air for _ in levels] + list(surface) + list(diagnostic)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Sequence[dict[str, torch.Tensor]] | Callable[[], object],
    *,
    channel_variables: Sequence[str],
    target_std: np.ndarray,
    lat_weights: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    state_channels: int,
    device: torch.device,
    members: int = 1,
    seed: int = 0,
    target_mean: np.ndarray | None = None,
    output_inverse: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, float]:
    """Skill over `batches` at their last target step (the lead: each batch's forecast
    rolls out autoregressively to it): `loss`, `rmse_<var>` and `persistence_rmse_<var>`.

    RMSE is in physical units (normalized error times the channel's std, or the grid point's), latitude
    weighted, pooled over samples, levels and grid points of each variable. Persistence
    (the last input frame as the forecast at the lead) exists for prognostic variables only.
    With `output_inverse` (pointwise output blocks, such as CREDIT's exp_transform), errors and
    spread are those of the de-normalised fields (x * std + `target_mean`) through it.
    """
    was_training = model.training
    model.eval()
    std = torch.as_tensor(as_fields(target_std)).unsqueeze(0)  # (1, C, 1 or lat, 1 or lon)
    if output_inverse is not None:
        mean = torch.as_tensor(as_fields(target_mean)).unsqueeze(0)

        def physical(x: torch.Tensor, channels: int | None = None) -> torch.Tensor:
            full = x.double().cpu()
            if channels is not None:  # a state: the inverse takes every target channel
                full = torch.cat([full, torch.zeros_like(full[:, :1]).expand(-1, std.shape[1] - channels, -1, -1)], 1)
            return output_inverse(full * std + mean)[:, : channels or std.shape[1]]
    weights = lat_weights.to(torch.float64).view(1, 1, -1, 1)
    model_sq = torch.zeros(len(channel_variables), dtype=torch.float64)
    spread_sq = torch.zeros(len(channel_variables), dtype=torch.float64)
    persist_sq = torch.zeros(state_channels, dtype=torch.float64)
    points = offset = 0
    loss_sum, loss_count = 0.0, 0
    for batch in batches:
        batch = {k: v.to(device) for k, v in batch.items()}
        state = batch["state"]
        lead = batch["target"].shape[1]
        target = batch["target"][:, -1]
        rows = target.shape[0] * members
        # a noise-injecting model draws the same noise at every validation (step key -1): its
        # members' scores are comparable from one validation to the next
        with dropout_step(seed, VALIDATION_STEP, offset, rows):
            *_, members_prediction = forecast_steps(model, with_members(batch, members), lead)
        offset += rows
        prediction = members_prediction
        spread_per_sample = None
        if members > 1:
            grouped = members_prediction.view(target.shape[0], members, *target.shape[1:])
            prediction = grouped.mean(1)
            if output_inverse is None:
                variance = grouped.double().cpu().var(dim=1) * std**2  # unbiased, physical units
            else:
                variance = physical(members_prediction).view(grouped.shape).var(dim=1)
            spread_per_sample = (variance * weights).sum(dim=(2, 3))
        if output_inverse is None:
            error = (prediction.double().cpu() - target.double().cpu()) * std
            persistence = (state[:, -1].double().cpu() - target[:, :state_channels].double().cpu())
            persistence = persistence * std[:, :state_channels]
        else:  # the ensemble mean of the de-normalised members, as a forecast writes it
            mean_physical = (physical(members_prediction).view(grouped.shape).mean(1) if members > 1
                             else physical(prediction))
            error = mean_physical - physical(target)
            persistence = (physical(state[:, -1], state_channels)
                           - physical(target[:, :state_channels], state_channels))
        model_per_sample = (error**2 * weights).sum(dim=(2, 3))
        persist_per_sample = (persistence**2 * weights).sum(dim=(2, 3))
        # sample by sample, in order: the totals do not depend on how samples were batched
        for i in range(target.shape[0]):
            loss_sum += float(loss_fn(members_prediction[i * members : (i + 1) * members], target[i : i + 1]))
            model_sq += model_per_sample[i]
            if spread_per_sample is not None:
                spread_sq += spread_per_sample[i]
            persist_sq += persist_per_sample[i]
        loss_count += target.shape[0]
        points += target.shape[0] * target.shape[2] * target.shape[3]
    model.train(was_training)
    if points == 0:
        raise ValueError("validation ran on no samples")
    results: dict[str, float] = {"loss": loss_sum / loss_count}
    for variable in dict.fromkeys(channel_variables):
        chans = [i for i, v in enumerate(channel_variables) if v == variable]
        results[f"rmse_{variable}"] = math.sqrt(float(model_sq[chans].sum()) / (points * len(chans)))
        if members > 1:  # the members' spread, pooled as the RMSE is
            results[f"spread_{variable}"] = math.sqrt(float(spread_sq[chans].sum()) / (points * len(chans)))
        if all(c < state_channels for c in chans):
            mse = persist_sq[chans].sum() / (points * len(chans))
            results[f"persistence_rmse_{variable}"] = math.sqrt(float(mse))
    return results
