"""The windowformer's convolutions and norms for deterministic mode, through the fixed-tree GEMM.

Same parameters and state-dict keys as the torch layers they subclass (checkpoints move
between modes), different arithmetic: every reduction over the batch (weight and bias
gradients, norm affine gradients) is the GEMM's row tree with each sample's rows padded to
whole 32-row leaves, so a batch split at sample boundaries is a split of that tree, and
every forward row is computed alone (batch invariance). Hand-written because torch's
convolutions (oneDNN) and norm backward kernels pick their reduction order by shape.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from credit.kernels.gemm._dtensor import tree_all_reduce
from credit.kernels.gemm._ops import grouped_weight_grad, linear_local, row_sum, row_sum_of_products
from credit.kernels.gemm._tree import tree_sum
from credit.kernels.gemm._registry import resolve
from credit.models.deterministic import conv as det_conv

_BACKEND = "auto"


class ConvGeometry(NamedTuple):
    """What a convolution's arithmetic needs besides its tensors (an nn.Conv2d has all four)."""

    kernel_size: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)


def det_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, geometry) -> torch.Tensor:
    """A one-group, zero-padded convolution of NCHW `x` by the fixed-tree GEMM; `geometry`
    is an nn.Conv2d or a ConvGeometry."""
    if resolve(_BACKEND, x.device) == "cpu" and x.dtype == torch.float32:
        return det_conv.conv2d(x, weight, bias, geometry)  # same bits, no im2col copies
    return _matrix_conv2d(x, weight, bias, geometry)


def _matrix_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, geometry) -> torch.Tensor:
    """The definition: im2col rows times the GEMM (any backend); a stride-1 convolution's
    input gradient the convolution of its output gradient (`det_conv.input_grad_is_a_convolution`)."""
    if det_conv.input_grad_is_a_convolution(geometry):
        return _StrideOneConv2d.apply(x, weight, bias, geometry)
    return _unfolded_conv2d(x, weight, bias, geometry)


def _unfolded_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, geometry) -> torch.Tensor:
    """im2col rows times the GEMM; autograd through the unfold gives dx as patch gradients
    folded in col2im's order."""
    b, _, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geometry.kernel_size, geometry.stride, geometry.padding, geometry.dilation
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cols = F.unfold(x, geometry.kernel_size, dilation=geometry.dilation, padding=geometry.padding,
                    stride=geometry.stride)
    y = linear_local(cols.transpose(1, 2), weight.reshape(weight.shape[0], -1), bias, _BACKEND, groups=b)
    # contiguous NCHW: torch picks other kernels (by batch size) for channels-last inputs
    return y.transpose(1, 2).reshape(b, weight.shape[0], ho, wo).contiguous()


class _StrideOneConv2d(torch.autograd.Function):
    """`_unfolded_conv2d` with the weight and bias gradients of its GEMM (the row tree over
    each sample's positions) and the input gradient as the convolution of g, padded by
    k - 1 - p, by the flipped, transposed weight."""

    @staticmethod
    def forward(ctx, x, weight, bias, geometry):  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.geometry, ctx.has_bias = geometry, bias is not None
        return _unfolded_conv2d(x, weight, bias, geometry)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        geometry, b, c_out = ctx.geometry, x.shape[0], weight.shape[0]
        backend = resolve(_BACKEND, x.device)
        g = grad.to(x.dtype)
        gx = gw = gb = None
        # the GEMM's rows: (sample, position), channels last
        rows = g.reshape(b, c_out, -1).transpose(1, 2).reshape(-1, c_out)
        if ctx.needs_input_grad[1]:
            cols = F.unfold(x, geometry.kernel_size, dilation=geometry.dilation, padding=geometry.padding,
                            stride=geometry.stride)
            cols = cols.transpose(1, 2).reshape(rows.shape[0], -1)
            gw = grouped_weight_grad(rows, cols, b, backend, x.dtype).view(weight.shape)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = row_sum(rows, b, backend, x.dtype)
        if ctx.needs_input_grad[0]:
            adjoint = ConvGeometry(tuple(geometry.kernel_size), (1, 1), det_conv.adjoint_padding(geometry), (1, 1))
            gx = _unfolded_conv2d(g, det_conv.adjoint_weight(weight), None, adjoint)
        return gx, gw, gb, None


class DetConv2d(nn.Conv2d):
    """`nn.Conv2d` (zero padding, one group) as im2col rows times the GEMM."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.groups != 1 or self.padding_mode != "zeros":
            raise NotImplementedError("DetConv2d supports groups=1 and zero padding")
        return det_conv2d(x, self.weight, self.bias, self)

    def matrix_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The definition: im2col rows times the GEMM (any backend)."""
        return _matrix_conv2d(x, self.weight, self.bias, self)


class DetConvTranspose2d(nn.ConvTranspose2d):
    """`nn.ConvTranspose2d` that multiplies the size by its stride (kernel - stride =
    2·padding): each input pixel's channels times the (C_in, C_out·kh·kw) GEMM, placed (kernel
    == stride) or folded in col2im's order (overlapping kernels, e.g. CREDIT's k=4, s=2, p=1
    output head)."""

    def forward(self, x: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        if (self.output_padding != (0, 0) or self.dilation != (1, 1) or self.groups != 1
                or output_size is not None or self.stride[0] != self.stride[1]
                or any(k - s != 2 * p for k, s, p in zip(self.kernel_size, self.stride, self.padding))):
            raise NotImplementedError("DetConvTranspose2d supports one group and kernel - stride = 2 * padding")
        if resolve(_BACKEND, x.device) == "cpu" and x.dtype == torch.float32:  # same bits, no copies
            if self.kernel_size == self.stride:
                return det_conv.conv_transpose2d(x, self.weight, self.bias)
            return det_conv.conv_transpose2d_overlapping(x, self.weight, self.bias, self)
        return self.matrix_forward(x)

    def matrix_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The definition: each input pixel's channels times the (C_in, C_out·kh·kw) GEMM,
        then the blocks placed side by side, or added by F.fold where they overlap."""
        b, c_in, h, w = x.shape
        kh, kw = self.kernel_size
        weight = self.weight.reshape(c_in, -1).t()  # (C_out * kh * kw, C_in)
        y = linear_local(x.permute(0, 2, 3, 1), weight, None, _BACKEND, groups=b)
        if self.kernel_size != self.stride:
            size = tuple(n * s for n, s in zip((h, w), self.stride))
            y = F.fold(y.reshape(b, h * w, -1).transpose(1, 2), size, self.kernel_size,
                       padding=self.padding, stride=self.stride).permute(0, 2, 3, 1)
        else:
            y = y.view(b, h, w, self.out_channels, kh, kw).permute(0, 1, 4, 2, 5, 3)
            y = y.reshape(b, h * kh, w * kw, self.out_channels)  # channels-last rows per sample
        if self.bias is not None:
            y = channel_affine(y, None, self.bias)
        return y.permute(0, 3, 1, 2).contiguous()


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
        if x.dim() == 4 and _plain_cpu_fp32(x, self.weight, self.bias):
            return _PlanarGroupNorm.apply(x, self.weight, self.bias, self.num_groups, self.eps)
        # contiguous NCHW: torch's channels-last group norm chooses its algorithm by batch size
        normed = F.group_norm(x.contiguous(), self.num_groups, None, None, self.eps)
        out = channel_affine(normed.permute(0, 2, 3, 1), self.weight, self.bias)
        return out.permute(0, 3, 1, 2).contiguous()
