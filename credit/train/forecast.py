"""The autoregressive forecast of a training sample, and the training loss over its steps."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

from credit.models.inputs import predict


def forecast_steps(model: nn.Module, batch: dict[str, torch.Tensor], steps: int) -> Iterator[torch.Tensor]:
    """The predictions of `steps` autoregressive steps from `batch`'s state, one per step.

    Each step's prediction (its state channels) is fed back, detached, as the newest history
    frame, beside the forcing of that step's times and the static fields; a CREDIT model's
    conservation post blocks read the forecast's first input state. The gradient of a
    step stays within that step (the usual multi-step fine-tuning; CREDIT's trainers and
    their validation roll out the same way).
    """
    state, forcing, static = batch["state"], batch["forcing"], batch["static"]
    history_len = state.shape[1]
    state_channels = state.shape[2]
    initial_state = state
    for step in range(steps):
        prediction = predict(model, state, forcing[:, step : history_len + step + 1], static, initial_state)
        yield prediction
        if step + 1 < steps:
            newest = prediction[:, :state_channels].detach().unsqueeze(1)
            state = torch.cat([state[:, 1:], newest], dim=1)


def forecast_loss(
    model: nn.Module,
    batch: dict[str, torch.Tensor],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    steps: str = "mean",
) -> torch.Tensor:
    """The loss over the batch's `forecast_len` autoregressive steps (`forecast_steps`): their
    mean, or with `steps="sum"` their sum (CREDIT's trainers backpropagate each step's loss)."""
    target = batch["target"]
    forecast_len = target.shape[1]
    total = batch["state"].new_zeros(())
    for step, prediction in enumerate(forecast_steps(model, batch, forecast_len)):
        total = total + loss_fn(prediction, target[:, step])
    return total / forecast_len if steps == "mean" else total
