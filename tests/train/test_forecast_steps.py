"""`trainer.loss.forecast_steps=sum` trains what CREDIT's trainers train on a multi-step
forecast: each step's loss backpropagated on its own (the prediction fed back detached), i.e.
the gradients of the steps added; in deterministic mode exactly twice the mean's gradient
over two steps."""

from __future__ import annotations

import torch
from torch import nn

from credit.models.inputs import predict
from credit.train.losses import WeightedLoss
from credit.train.step import backward_micro_batch

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
