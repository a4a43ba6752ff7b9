"""Layer and group norms for deterministic mode, and the per-channel affine they share.

Same parameters and state-dict keys as the torch layers they subclass (checkpoints move
between modes). Each row (a layer norm) or each sample's group (a group norm) is normalised
in a fixed order of its own values, so a row's bits do not depend on the batch around it;
the affine gradients, reductions over the batch, go by the GEMM's row tree grouped by
sample, so a batch split at sample boundaries is a split of that tree. On the CPU in fp32
the kernels of `credit.kernels.gemm` (csrc/cpu_layer_norm.cpp, csrc/cpu_group_norm.cpp) do
each way in one pass; elsewhere torch's normalisation and `channel_affine`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from credit.kernels.gemm._dtensor import tree_all_reduce
from credit.kernels.gemm._ops import row_sum, row_sum_of_products
from credit.kernels.gemm._registry import resolve
from credit.kernels.gemm._tree import tree_sum

_BACKEND = "auto"


def _plain_cpu_fp32(*tensors: torch.Tensor | None) -> bool:
    """Every tensor given, plain (not a DTensor), fp32 and on the CPU, with the CPU kernel built."""
    from torch.distributed.tensor import DTensor

    from credit.kernels.gemm import _cpu

    return (all(t is not None and not isinstance(t, DTensor) and t.device.type == "cpu"
                and t.dtype == torch.float32 for t in tensors)
            and _cpu.unavailable_reason() is None)


class _ChannelAffine(torch.autograd.Function):
    """`x * weight + bias` over the last dim; weight/bias gradients by the row tree."""

    @staticmethod
    def forward(ctx, x, weight, bias, groups, sequence_group):  # type: ignore[override]
        ctx.save_for_backward(x if weight is not None else None, weight)  # a bias alone needs no x
        ctx.groups, ctx.has_bias, ctx.sequence_group = groups, bias is not None, sequence_group
        if _plain_cpu_fp32(x, weight, bias) and x.is_contiguous() and x.dim() >= 2:
            from credit.kernels.gemm import _cpu

            # the bits of the two ops below in one pass (torch broadcasts a short C slowly)
            return _cpu.affine(x.view(-1, x.shape[-1]), weight, bias).view(x.shape)
        y = x * weight if weight is not None else x
        return y + bias if bias is not None else y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        backend = resolve(_BACKEND, grad.device)
        want_w = weight is not None and ctx.needs_input_grad[1]
        want_b = ctx.has_bias and ctx.needs_input_grad[2]
        if (want_w and want_b and ctx.sequence_group is None and backend == "cpu"
                and grad.dtype == x.dtype == weight.dtype == torch.float32):
            from credit.kernels.gemm import _cpu

            # the three results below in one pass over the gradient
            gx, gw, gb = _cpu.affine_grads(grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1]),
                                           weight, ctx.groups)
            return gx.view(grad.shape), gw, gb, None, None
        gx = grad * weight if weight is not None else grad
        if ctx.sequence_group is not None:
            gw, gb = _sequence_sums(grad, x, want_w, want_b, ctx.sequence_group, backend)
            return gx, gw, gb, None, None
        rows = grad.reshape(-1, grad.shape[-1])
        gw = row_sum_of_products(rows, x.reshape(rows.shape), ctx.groups, backend, weight.dtype) if want_w else None
        gb = row_sum(rows, ctx.groups, backend, rows.dtype) if want_b else None
        return gx, gw, gb, None, None


def _sequence_sums(grad: torch.Tensor, x: torch.Tensor, want_w: bool, want_b: bool,
                   group: dist.ProcessGroup, backend: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Affine gradients when each rank holds some rows of every sample: per sample, this
    rank's row tree, then the ranks' trees added in rank order, then the samples' sums by the
    tree: one process's row tree when each rank's rows of a sample are whole leaves and the
    rank and sample counts are powers of two."""
    per_sample = []
    for g, xs in zip(grad.unbind(0), x.unbind(0)):
        rows = g.reshape(-1, g.shape[-1])
        parts = ([row_sum_of_products(rows, xs.reshape(rows.shape), 1, backend, rows.dtype)] if want_w else []) + \
                ([row_sum(rows, 1, backend, rows.dtype)] if want_b else [])
        per_sample.append(torch.stack(parts))
    summed = tree_sum(list(tree_all_reduce(torch.stack(per_sample), group).unbind(0)))
    gw = summed[0] if want_w else None
    gb = summed[-1] if want_b else None
    return gw, gb


def channel_affine(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   sequence_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Per-channel affine on channels-last `x (B, ..., C)`; rows grouped by sample.

    `sequence_group`: `x` holds this rank's rows of each sample (sequence parallelism); the
    affine gradients are summed over the group (`_sequence_sums`)."""
    if x.numel() == 0 and sequence_group is None:  # no rows: nothing to reduce, zero gradients
        y = x * weight if weight is not None else x
        return y + bias if bias is not None else y
    return _ChannelAffine.apply(x, weight, bias, x.shape[0], sequence_group)


_UNIT_AFFINE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _unit_affine(shape: tuple[int, ...], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ones and zeros of `shape`: torch's CPU layer norm with them takes its faster affine loop
    (0.29 ms vs 0.46 for 8192 x 32) and gives the bits of none (checked: output and dx)."""
    key = (shape, x.dtype, x.device)
    if key not in _UNIT_AFFINE:
        _UNIT_AFFINE[key] = (torch.ones(shape, dtype=x.dtype, device=x.device),
                             torch.zeros(shape, dtype=x.dtype, device=x.device))
    return _UNIT_AFFINE[key]


def normalized(x: torch.Tensor, shape: tuple[int, ...], eps: float) -> torch.Tensor:
    """torch's layer norm of `x` over its trailing `shape`, without an affine (a DTensor's
    as it is; a plain tensor's through the unit affine, the same bits faster)."""
    from torch.distributed.tensor import DTensor

    ones, zeros = (None, None) if isinstance(x, DTensor) else _unit_affine(tuple(shape), x)
    return F.layer_norm(x, shape, ones, zeros, eps)


_ROW_KERNEL_MAX_D = 8
"""Widest rows DetLayerNorm gives the CPU kernel (narrow rows are where torch's per-row setup
dominates: 131072 rows of 4, 13.4 ms forward and backward in torch, 6.0 in the kernel; at 64
values a row torch is faster)."""


def row_layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                   sequence_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Deterministic layer norm over the last dim of `x (B, ..., D)`: each row normalised in
    a fixed order of its own values, the affine gradients by the row tree grouped by sample
    (dim 0; over `sequence_group` as `channel_affine`'s).

    Plain fp32 CPU rows with both affine terms take the CPU kernels (`_RowLayerNorm` for rows
    of at most 8 values, `_WideRowLayerNorm` above: the affine in the normalisation's pass,
    its gradients in the input gradient's); the rest torch's normalisation and
    `channel_affine`. Each is batch-invariant; their bits differ, so every layout of a run on
    the CPU takes the same one."""
    d = x.shape[-1]
    if x.numel() == 0 and sequence_group is None:  # no rows: nothing to reduce, zero gradients
        return F.layer_norm(x, (d,), weight, bias, eps)
    if x.dim() >= 2 and _plain_cpu_fp32(x, weight, bias):
        kernel = _RowLayerNorm if d <= _ROW_KERNEL_MAX_D else _WideRowLayerNorm
        return kernel.apply(x, weight, bias, eps, sequence_group)
    return channel_affine(normalized(x, (d,), eps), weight, bias, sequence_group)


class DetLayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` over the last dim: a per-row normalisation, tree affine gradients
    (`row_layer_norm`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.normalized_shape) == 1:
            return row_layer_norm(x, self.weight, self.bias, self.eps)
        return channel_affine(normalized(x, tuple(self.normalized_shape), self.eps), self.weight, self.bias)


def _row_affine_grads(grad: torch.Tensor, normed: torch.Tensor, gw: torch.Tensor, gb: torch.Tensor,
                      sequence_group: dist.ProcessGroup | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' affine gradients, or under sequence parallelism (each rank holding some
    rows of every sample) `_sequence_sums`' over the group, of `grad` and the normed rows."""
    if sequence_group is None:
        return gw, gb
    gw, gb = _sequence_sums(grad, normed.view(grad.shape), True, True, sequence_group, "cpu")
    return gw, gb


class _RowLayerNorm(torch.autograd.Function):
    """Layer norm of narrow fp32 CPU rows by the CPU kernel: the normalisation and affine in
    one pass (torch's layer norm spends ~40 ns a row on setup, 5 ms for the column attention's
    131072 rows of 4 channels), the affine gradients by the row tree grouped by sample (dim
    0), as `channel_affine`'s."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, sequence_group):  # type: ignore[override]
        from credit.kernels.gemm import _cpu

        y, normed, rstd = _cpu.layer_norm(x.reshape(-1, x.shape[-1]), weight, bias, eps)
        ctx.save_for_backward(normed, rstd, weight)
        ctx.groups, ctx.sequence_group = x.shape[0], sequence_group
        return y.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        from credit.kernels.gemm import _cpu

        normed, rstd, weight = ctx.saved_tensors
        g_normed, gw, gb = _cpu.affine_grads(grad.reshape(normed.shape), normed, weight, ctx.groups)
        gx = _cpu.layer_norm_input_grad(g_normed, normed, rstd) if ctx.needs_input_grad[0] else None
        gw, gb = _row_affine_grads(grad, normed, gw, gb, ctx.sequence_group)
        return (gx.view(grad.shape) if gx is not None else None), gw, gb, None, None


class _WideRowLayerNorm(torch.autograd.Function):
    """Layer norm of wider fp32 CPU rows by the CPU kernel (each row's sums as 16 strided
    chains and a fixed tree): the affine in the normalisation's pass, and backward the input
    gradient and the affine gradients' row-tree sums in one pass from x, mean and rstd, where
    torch's normalisation and `channel_affine` take two more passes and nodes (and keep the
    normed values as well as x)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, sequence_group):  # type: ignore[override]
        from credit.kernels.gemm import _cpu

        rows = x.reshape(-1, x.shape[-1]).contiguous()
        y, mean, rstd = _cpu.layer_norm_rows(rows, weight, bias, eps)
        ctx.save_for_backward(rows, mean, rstd, weight)
        ctx.groups, ctx.sequence_group = x.shape[0], sequence_group
        return y.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        from credit.kernels.gemm import _cpu

        rows, mean, rstd, weight = ctx.saved_tensors
        gx, gw, gb = _cpu.layer_norm_rows_grads(grad.reshape(rows.shape), rows, mean, rstd, weight, ctx.groups)
        if ctx.sequence_group is not None:  # the normed rows, as the kernel computes them
            normed = (rows - mean[:, None]) * rstd[:, None]
            gw, gb = _row_affine_grads(grad, normed, gw, gb, ctx.sequence_group)
        return gx.view(grad.shape), gw, gb, None, None


class _PlanarGroupNorm(torch.autograd.Function):
    """Group norm of fp32 CPU NCHW `x` with its per-channel affine by the CPU kernel, in one
    pass each way (each sample's group summed in a fixed lane order; the affine gradients by
    the row tree of its channels-last rows, each sample's positions padded to whole leaves,
    as `channel_affine`'s), where torch's normalisation, the affine and its gradients take
    three passes and two nodes."""

    @staticmethod
    def forward(ctx, x, weight, bias, groups, eps):  # type: ignore[override]
        from credit.kernels.gemm import _cpu

        x = x.contiguous()
        y, mean, rstd = _cpu.group_norm(x, weight, bias, groups, eps)
        ctx.save_for_backward(x, mean, rstd, weight)
        ctx.groups = groups
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        from credit.kernels.gemm import _cpu

        x, mean, rstd, weight = ctx.saved_tensors
        gx, gw, gb = _cpu.group_norm_grads(grad, x, mean, rstd, weight, ctx.groups)
        return gx, gw, gb, None, None


class DetGroupNorm(nn.GroupNorm):
    """`nn.GroupNorm` on (B, C, H, W): per-sample statistics, tree affine gradients."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == 0:  # no samples: nothing to reduce, zero gradients
            return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
        if x.dim() == 4 and _plain_cpu_fp32(x, self.weight, self.bias):
            return _PlanarGroupNorm.apply(x, self.weight, self.bias, self.num_groups, self.eps)
        # contiguous NCHW: torch's channels-last group norm chooses its algorithm by batch size
        normed = F.group_norm(x.contiguous(), self.num_groups, None, None, self.eps)
        out = channel_affine(normed.permute(0, 2, 3, 1), self.weight, self.bias)
        return out.permute(0, 3, 1, 2).contiguous()
