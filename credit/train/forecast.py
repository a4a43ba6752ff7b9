"""The training loss of a (multi-step) forecast."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from credit.models.inputs import predict


def forecast_loss(
    model: nn.Module,
    batch: dict[str, torch.Tensor],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    steps: str = "mean",
) -> torch.Tensor:
    """The loss over `forecast_len` autoregressive steps: their mean, or with `steps="sum"`
    their sum (CREDIT's trainers backpropagate each step's loss).

    Each step's prediction is fed back, detached, as the newest history frame, so the
    gradient of a step stays within that step (the usual multi-step fine-tuning).
    """
    state, forcing, static, target = batch["state"], batch["forcing"], batch["static"], batch["target"]
    history_len = state.shape[1]
    state_channels = state.shape[2]
    forecast_len = target.shape[1]
    total = state.new_zeros(())
    initial_state = state
    for step in range(forecast_len):
        prediction = predict(model, state, forcing[:, step : history_len + step + 1], static, initial_state)
        total = total + loss_fn(prediction, target[:, step])
        if step + 1 < forecast_len:
            newest = prediction[:, :state_channels].detach().unsqueeze(1)
            state = torch.cat([state[:, 1:], newest], dim=1)
    return total / forecast_len if steps == "mean" else total
