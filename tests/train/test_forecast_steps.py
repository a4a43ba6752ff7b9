"""`trainer.loss.forecast_steps=sum` trains what CREDIT's trainers train on a multi-step
forecast: each step's loss backpropagated on its own (the prediction fed back detached), i.e.
the gradients of the steps added; in deterministic mode exactly twice the mean's gradient
over two steps. Validation at a lead of several steps (`data.valid_forecast_len`) scores the
last of them, as CREDIT's validation does."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from credit.models.inputs import predict
from credit.train.losses import WeightedLoss
from credit.train.step import backward_micro_batch
from credit.train.validation import evaluate

STEPS, STATE, FORCING, STATIC, GRID = 2, 3, 1, 2, (4, 8)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(STATE + FORCING + STATIC, 8, 3, padding=1), nn.GELU(), nn.Conv2d(8, STATE, 1))


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"state": torch.randn(2, 1, STATE, *GRID, generator=g),
            "forcing": torch.randn(2, 1 + STEPS, FORCING, *GRID, generator=g),
            "static": torch.randn(2, STATIC, *GRID, generator=g),
            "target": torch.randn(2, STEPS, STATE, *GRID, generator=g)}


def _loss() -> WeightedLoss:
    return WeightedLoss(torch.linspace(0.5, 1.5, GRID[0]), torch.tensor([1.0, 2.0, 0.5]), "mse")


def _grads(model: nn.Module) -> list[torch.Tensor]:
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return grads


def test_the_sum_is_each_steps_loss_backpropagated_as_credit_does():
    model, batch, loss_fn = _model(), _batch(), _loss()
    backward_micro_batch(model, batch, loss_fn, accum=1, deterministic=False, step_samples=2, forecast_steps="sum")
    ours = _grads(model)
    state = batch["state"]
    for step in range(STEPS):  # CREDIT's loop: predict, backward this step's loss, feed back detached
        prediction = predict(model, state, batch["forcing"][:, step: step + 2], batch["static"])
        loss_fn(prediction, batch["target"][:, step]).backward()
        state = prediction.detach().unsqueeze(1)
    for mine, credits in zip(ours, _grads(model)):
        torch.testing.assert_close(mine, credits, rtol=1e-6, atol=1e-7)
    backward_micro_batch(model, batch, loss_fn, accum=1, deterministic=False, step_samples=2)
    mean = _grads(model)
    assert not torch.allclose(mean[0], ours[0])  # the default (mean) is another objective


def test_deterministic_sum_is_exactly_twice_the_mean_over_two_steps():
    model, batch, loss_fn = _model(), _batch(), _loss()
    sums, scale_sum = backward_micro_batch(model, batch, loss_fn, accum=1, deterministic=True, step_samples=2,
                                           forecast_steps="sum")
    summed = _grads(model)
    _, scale_mean = backward_micro_batch(model, batch, loss_fn, accum=1, deterministic=True, step_samples=2)
    for a, b in zip(summed, _grads(model)):
        assert torch.equal(a, 2 * b)
    assert scale_sum == 2 * scale_mean and sums.shape == (2,)


def test_validation_rolls_out_to_its_lead_and_scores_the_last_step_as_credit_does():
    model, batch, loss_fn = _model(), _batch(), _loss()
    std, weights = np.array([1.0, 2.0, 0.5]), torch.linspace(0.5, 1.5, GRID[0])
    ours = evaluate(model, [batch], channel_variables=["a", "b", "c"], target_std=std, lat_weights=weights,
                    loss_fn=loss_fn, state_channels=STATE, device=torch.device("cpu"))
    state = batch["state"]
    with torch.no_grad():  # CREDIT's validation loop: predict, feed back, score only the last step
        for step in range(STEPS):
            prediction = predict(model, state, batch["forcing"][:, step: step + 2], batch["static"])
            state = prediction.unsqueeze(1)
        target = batch["target"][:, STEPS - 1]
        losses = [float(loss_fn(prediction[i: i + 1], target[i: i + 1])) for i in range(2)]
    assert ours["loss"] == pytest.approx(sum(losses) / 2, rel=1e-12)
    w = weights.double().view(1, -1, 1)
    points = 2 * GRID[0] * GRID[1]
    for c, name in enumerate("abc"):
        error = (prediction[:, c].double() - target[:, c].double()) * std[c]
        assert ours[f"rmse_{name}"] == pytest.approx(math.sqrt(float((error**2 * w).sum()) / points), rel=1e-12)
        stay = (batch["state"][:, -1, c].double() - target[:, c].double()) * std[c]  # persistence at the lead
        assert ours[f"persistence_rmse_{name}"] == pytest.approx(math.sqrt(float((stay**2 * w).sum()) / points),
                                                                 rel=1e-12)
    one_step = evaluate(model, [{**batch, "target": batch["target"][:, :1]}], channel_variables=["a", "b", "c"],
                        target_std=std, lat_weights=weights, loss_fn=loss_fn, state_channels=STATE,
                        device=torch.device("cpu"))
    assert one_step["loss"] != ours["loss"]  # the lead is what is scored
