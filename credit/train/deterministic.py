"""The loss in deterministic mode: per-sample sums, one tree over the global batch.

The fast loss is a mean over (batch, channel, lat, lon), whose reduction order depends on
the per-rank batch. Here each sample's weighted error is summed by the GEMM's K tree
(a row of its own, so the same bits at any batch size), and the backward seed of every sample
is the same constant, 1 / (global batch x elements x forecast steps), in every layout. The
reported loss gathers the per-sample sums of every data-parallel rank and adds them by the
tree in global sample order, so one process and every layout print the same bits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from credit.kernels.gemm import det_mm
from credit.kernels.gemm._tree import tree_sum
from credit.models.inputs import predict


class _RowSums(torch.autograd.Function):
    """(B,) sums of the rows of `weighted (B, K)` by the GEMM's K tree (`weighted @ ones`);
    backward each row's gradient repeated along it: the GEMM's own backward, `g @ onesᵀ`,
    is one product `g * 1` an element, exact, so the bits are the same without forming it."""

    @staticmethod
    def forward(ctx, weighted):  # type: ignore[override]
        ones = torch.ones((weighted.shape[1], 1), dtype=weighted.dtype, device=weighted.device)
        ctx.k = weighted.shape[1]
        with torch.no_grad():
            return det_mm(weighted, ones)[:, 0]

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad[:, None].expand(grad.shape[0], ctx.k)


def row_sums(weighted: torch.Tensor) -> torch.Tensor:
    """(B,) sums of the rows of `weighted` (B, ...), each by the fixed K tree."""
    return _RowSums.apply(weighted.reshape(weighted.shape[0], -1))


def sample_sums(prediction: torch.Tensor, target: torch.Tensor,
                weighted_error: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """(B,) per-sample sums of the weighted error, each by the fixed K tree (an ensemble's
    `prediction` holds B x members forecasts; the error, one per sample)."""
    return row_sums(weighted_error(prediction, target).reshape(target.shape[0], -1))


def forecast_sample_sums(model: nn.Module, batch: dict[str, torch.Tensor],
                         step_sums: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """(B,) per-sample sums over `forecast_len` autoregressive steps (added step by step) of
    `step_sums(prediction, target)` (a loss's `sample_sums`); the prediction is fed back
    detached, as in the fast loss."""
    state, forcing, static, target = batch["state"], batch["forcing"], batch["static"], batch["target"]
    history_len, state_channels = state.shape[1], state.shape[2]
    total, initial_state = None, state
    for step in range(target.shape[1]):
        prediction = predict(model, state, forcing[:, step : history_len + step + 1], static, initial_state)
        sums = step_sums(prediction, target[:, step])
        total = sums if total is None else total + sums
        if step + 1 < target.shape[1]:
            state = torch.cat([state[:, 1:], prediction[:, :state_channels].detach().unsqueeze(1)], dim=1)
    return total


def global_loss(sums: list[torch.Tensor], scale: float, dp_group: dist.ProcessGroup | None) -> float:
    """The step's loss: every rank's per-sample sums (micro-batch, dp rank, sample order)
    added by one tree, times `scale`. The same bits on every rank and in every layout."""
    if dp_group is not None and dist.get_world_size(dp_group) > 1:
        gathered = []
        for local in sums:
            parts = [torch.empty_like(local) for _ in range(dist.get_world_size(dp_group))]
            dist.all_gather(parts, local.contiguous(), group=dp_group)
            gathered.extend(parts)
        sums = gathered
    values = list(torch.cat(sums).unbind(0))
    return float(tree_sum(values) * scale)
