"""Convolutions for deterministic mode, through the fixed-tree GEMM (the norms: `norms.py`).

Same parameters and state-dict keys as the torch layers they subclass (checkpoints move
between modes), different arithmetic: every reduction over the batch (weight and bias
gradients) is the GEMM's row tree with each sample's rows padded to whole 32-row leaves, so
a batch split at sample boundaries is a split of that tree, and every forward row is
computed alone (batch invariance). No tensor-parallel plan shards a convolution, so its
forward K (C_in·kh·kw) and its input gradient's N (C_out) are whole reductions (`WHOLE`:
one MMA chain on the triton backend, docs/kernels.md); its weight and bias gradients keep
the row tree that data-parallel splits need. Hand-written because torch's convolutions
(oneDNN) pick their reduction order by shape.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from credit.kernels.gemm._ops import grouped_weight_grad, linear_local, row_sum
from credit.kernels.gemm._registry import resolve
from credit.models.deterministic import conv as det_conv
from credit.models.deterministic import conv_transpose as det_conv_transpose
from credit.models.deterministic.norms import channel_affine
from credit.models.deterministic.slabs import convolution_in_slabs, fits, fold, patch_rows, slab_conv2d

_BACKEND = "auto"
WHOLE = (True, True)
"""A convolution's (forward K, input-gradient N): never cut by a tensor-parallel split."""


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
    stride_one = det_conv.input_grad_is_a_convolution(geometry)
    if not fits(x, weight, geometry):  # the same bits a slab at a time (slabs.py)
        return slab_conv2d(x, weight, bias, geometry, _adjoint(geometry) if stride_one else None,
                           backend=_BACKEND)
    if stride_one:
        return _StrideOneConv2d.apply(x, weight, bias, geometry)
    return _unfolded_conv2d(x, weight, bias, geometry)


def _adjoint(geometry) -> ConvGeometry:
    """The stride-1 convolution of g whose result defines a stride-1 convolution's dx."""
    return ConvGeometry(tuple(geometry.kernel_size), (1, 1), det_conv.adjoint_padding(geometry), (1, 1))


def _unfolded_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, geometry) -> torch.Tensor:
    """im2col rows times the GEMM; autograd through the unfold gives dx as patch gradients
    folded in col2im's order. Where no gradient flows back through it (a custom function's
    forward or backward), the rows are copied once from a strided view instead (F.unfold and
    the GEMM's contiguous copy of its transpose held two im2col matrices): the same values."""
    b, _, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geometry.kernel_size, geometry.stride, geometry.padding, geometry.dilation
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if torch.is_grad_enabled() and x.requires_grad:
        cols = _Unfold.apply(x, geometry).transpose(1, 2)
    else:
        cols = patch_rows(x, weight.shape[0], geometry).view(b, ho * wo, -1)
    y = linear_local(cols, weight.reshape(weight.shape[0], -1), bias, _BACKEND, groups=b, whole=WHOLE)
    # contiguous NCHW: torch picks other kernels (by batch size) for channels-last inputs
    return y.transpose(1, 2).reshape(b, weight.shape[0], ho, wo).contiguous()


class _Unfold(torch.autograd.Function):
    """F.unfold, and its gradient folded in col2im's order into a tensor of x's size (autograd's
    own fold would hand back a gradient holding an im2col matrix's storage: `slabs.fold`)."""

    @staticmethod
    def forward(ctx, x, geometry):  # type: ignore[override]
        ctx.geometry, ctx.size = geometry, x.shape[-2:]
        return F.unfold(x, geometry.kernel_size, dilation=geometry.dilation, padding=geometry.padding,
                        stride=geometry.stride)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        g = ctx.geometry
        return fold(grad, tuple(ctx.size), g.kernel_size, g.dilation, g.padding, g.stride), None


class _Fold(torch.autograd.Function):
    """`slabs.fold` (F.fold's bits in a tensor of its own size), with F.fold's gradient: the
    im2col of the output's gradient."""

    @staticmethod
    def forward(ctx, cols, size, kernel_size, padding, stride):  # type: ignore[override]
        ctx.args = kernel_size, padding, stride
        return fold(cols, size, kernel_size, (1, 1), padding, stride)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        kernel_size, padding, stride = ctx.args
        return F.unfold(grad, kernel_size, padding=padding, stride=stride), None, None, None, None


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
            # F.unfold's columns, copied once from a strided view of the padded input (unfold
            # and the transposed copy held two im2col matrices)
            cols = patch_rows(x, c_out, geometry)
            gw = grouped_weight_grad(rows, cols, b, backend, x.dtype).view(weight.shape)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = row_sum(rows, b, backend, x.dtype)
        if ctx.needs_input_grad[0]:  # a slab at a time where g's im2col rows pass the budget
            gx = convolution_in_slabs(g, det_conv.adjoint_weight(weight), _adjoint(geometry), backend)
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
                return det_conv_transpose.conv_transpose2d(x, self.weight, self.bias)
            return det_conv_transpose.conv_transpose2d_overlapping(x, self.weight, self.bias, self)
        return self.matrix_forward(x)

    def matrix_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The definition: each input pixel's channels times the (C_in, C_out·kh·kw) GEMM,
        then the blocks placed side by side, or added by F.fold where they overlap."""
        b, c_in, h, w = x.shape
        kh, kw = self.kernel_size
        weight = self.weight.reshape(c_in, -1).t()  # (C_out * kh * kw, C_in)
        y = linear_local(x.permute(0, 2, 3, 1), weight, None, _BACKEND, groups=b, whole=WHOLE)
        if self.kernel_size != self.stride:
            size = tuple(n * s for n, s in zip((h, w), self.stride))
            y = _Fold.apply(y.reshape(b, h * w, -1).transpose(1, 2), size, self.kernel_size, self.padding,
                            self.stride).permute(0, 2, 3, 1)
        else:
            y = y.view(b, h, w, self.out_channels, kh, kw).permute(0, 1, 4, 2, 5, 3)
            y = y.reshape(b, h * kh, w * kw, self.out_channels)  # channels-last rows per sample
        if self.bias is not None:
            y = channel_affine(y, None, self.bias)
        return y.permute(0, 3, 1, 2).contiguous()
