"""Deterministic mode in one process: batch invariance and sample-aligned gradient trees."""

import pytest
import torch
from tiny import SMALL_MODEL

from credit.kernels.gemm._tree import tree_sum
from credit.models import build_model
from credit.models.dropout import dropout_step
from credit.train.deterministic import sample_sums


def _model(grid, gemm="deterministic", **extra):
    torch.manual_seed(0)
    cfg = {**SMALL_MODEL, "gemm": gemm, **extra}
    return build_model(cfg, in_channels=9, out_channels=6, state_channels=6, history_len=1, grid=grid)


def _inputs(n, grid):
    i = torch.arange(n * 9 * grid[0] * grid[1], dtype=torch.float64)
    return torch.sin(i * 0.113).view(n, 9, *grid).float()


# (18, 36) pads to 24 x 40 on the way in: 120 and 30 tokens per sample at the two stages,
# not whole 32-row leaves, so each sample's rows are padded inside the reductions
@pytest.mark.parametrize("grid", [(16, 32), (18, 36)])
def test_a_forecast_is_the_same_alone_or_in_a_batch_of_8(grid):
    model = _model(grid).eval()
    x = _inputs(8, grid)
    with torch.no_grad():
        batched = model(x)
        for i in range(8):
            assert torch.equal(model(x[i : i + 1])[0], batched[i]), f"sample {i}"


def _grads(model, x, target, first_sample, global_batch):
    model.zero_grad(set_to_none=True)
    with dropout_step(seed=3, step=1, sample_offset=first_sample, local_batch=x.shape[0]):
        sums = sample_sums(model(x), target, lambda p, t: (p - t) ** 2)
        (tree_sum(list(sums.unbind(0))) * (1.0 / (global_batch * target[0].numel()))).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("grid", [(16, 32), (18, 36)])
def test_gradients_of_two_halves_add_up_to_the_whole_batch_bitwise(grid):
    """What a dp2 split relies on: each half's gradient is a subtree of the batch's."""
    model = _model(grid, attn_dropout=0.1, ff_dropout=0.1).train()
    x, target = _inputs(4, grid), _inputs(4, grid)[:, :6].flip(0)
    whole = _grads(model, x, target, 0, 4)
    first = _grads(model, x[:2], target[:2], 0, 4)
    second = _grads(model, x[2:], target[2:], 2, 4)
    different = [n for n in whole if not torch.equal(first[n] + second[n], whole[n])]
    assert not different, different


def test_modes_share_parameter_names_and_shapes():
    grid = (16, 32)
    fast, det = _model(grid, "fast").state_dict(), _model(grid).state_dict()
    assert {k: v.shape for k, v in fast.items()} == {k: v.shape for k, v in det.items()}
