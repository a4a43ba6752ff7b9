"""Deterministic transposed convolutions on the CPU as gather GEMMs (see conv.py for the
gather path and its helpers): kernel == stride upsampling, one GEMM per input pixel, and
overlapping kernels as the adjoint of the convolution from their output back to their input.
Hand-written for the same reason as conv.py: torch has no transposed convolution with a
caller-fixed reduction order.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch
from torch.autograd.function import once_differentiable

from credit.kernels.gemm import _cpu
from credit.models.deterministic.conv import (ar_steps, bias_grad, conv_tables, input_grad, padded, padded_rows,
                                              patches_times_weight, weight_grad)


@functools.lru_cache(maxsize=64)
def _upsample_tables(b: int, c_in: int, h: int, w: int, c_out: int, kh: int, kw: int) -> SimpleNamespace:
    plane, ho, wo = h * w, h * kh, w * kw
    n = c_out * kh * kw
    pixels = ar_steps(plane)
    # an input pixel's output block corner, and each (o, i, j)'s offset from it
    corner = (ar_steps(h, kh * wo)[:, None] + ar_steps(w, kw)[None, :]).reshape(-1)
    ncol = (ar_steps(c_out, ho * wo)[:, None, None] + ar_steps(kh, wo)[None, :, None] + ar_steps(kw)[None, None, :]).reshape(-1)
    return SimpleNamespace(
        x_rows=(ar_steps(b, c_in * plane)[:, None] + pixels[None, :]).reshape(-1),
        y_rows=(ar_steps(b, c_out * ho * wo)[:, None] + corner[None, :]).reshape(-1),
        x_rows_padded=padded_rows(pixels, c_in * plane, b),
        y_rows_padded=padded_rows(corner, c_out * ho * wo, b),
        out_rows_padded=padded_rows(ar_steps(ho * wo), c_out * ho * wo, b),
        ncol=ncol, n_ident=ar_steps(n), cin_by_plane=ar_steps(c_in, plane), cin_by_n=ar_steps(c_in, n),
    )


class _GatherUpsample(torch.autograd.Function):
    """ConvTranspose2d with kernel == stride: each input pixel's channels times (C_in, C_out·kh·kw)."""

    @staticmethod
    def forward(ctx, x, weight, bias):  # type: ignore[override]
        b, c_in, h, w = x.shape
        _, c_out, kh, kw = weight.shape
        t = _upsample_tables(b, c_in, h, w, c_out, kh, kw)
        x = x.contiguous()
        y = torch.empty((b, c_out, h * kh, w * kw), dtype=x.dtype)
        _cpu.mm_gather(x.view(-1), t.x_rows, t.cin_by_plane, weight.contiguous().view(-1), t.cin_by_n,
                       t.n_ident, y.view(-1), t.y_rows, t.ncol)
        if bias is not None:
            y = y + bias.view(1, -1, 1, 1)
        ctx.save_for_backward(x, weight)
        ctx.tables, ctx.has_bias = t, bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        t = ctx.tables
        b, c_in, h, w = x.shape
        c_out = weight.shape[1]
        g = grad.to(x.dtype).contiguous()
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:  # tree over (C_out, kh, kw)
            gx = torch.empty_like(x)
            _cpu.mm_gather(g.view(-1), t.y_rows, t.ncol, weight.contiguous().view(-1), t.n_ident,
                           t.cin_by_n, gx.view(-1), t.x_rows, t.cin_by_plane)
        if ctx.needs_input_grad[1]:  # row tree over padded input pixels
            gw = torch.empty(weight.shape, dtype=weight.dtype)
            _cpu.mm_gather(x.view(-1), t.cin_by_plane, t.x_rows_padded, g.view(-1), t.y_rows_padded,
                           t.ncol, gw.view(-1), t.cin_by_n, t.n_ident)
        if ctx.has_bias and ctx.needs_input_grad[2]:  # row tree over padded output pixels
            gb = bias_grad(g, t.out_rows_padded, c_out, g.shape[-2] * g.shape[-1], weight.dtype)
        return gx, gw, gb


def conv_transpose2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Kernel == stride transposed convolution of NCHW `x` on the CPU, bitwise the matrix path."""
    return _GatherUpsample.apply(x, weight, bias)


class _GatherFoldConvTranspose2d(torch.autograd.Function):
    """ConvTranspose2d with overlapping kernels (k - s = 2·padding): each input pixel's channels
    times (C_in, C_out·kh·kw), folded in col2im's order. The transposed convolution is the
    input gradient of the convolution from its output back to its input (same weight, stride
    and padding), so forward is that convolution's `input_grad`, dx its forward and dW its
    weight gradient: the matrix path's products and trees, without the sub-pixel kernel's
    zero taps (2.25x the products at k = 4, s = 2)."""

    @staticmethod
    def forward(ctx, x, weight, bias, conv):  # type: ignore[override]
        b, c_in, h, w = x.shape
        c_out = weight.shape[1]
        (kh, kw), (sh, sw), (ph, pw) = conv.kernel_size, conv.stride, conv.padding
        ho, wo = (h - 1) * sh - 2 * ph + kh, (w - 1) * sw - 2 * pw + kw
        # the adjoint convolution: C_out channels of (ho, wo) to C_in channels of (h, w)
        t = conv_tables(b, c_out, ho + 2 * ph, wo + 2 * pw, c_in, h, w, conv.kernel_size,
                         conv.stride, conv.dilation)
        x = x.contiguous()
        y = input_grad(x, weight, t, conv, (b, c_out, ho, wo), h * w, x.dtype)
        if bias is not None:  # one rounding of the fp32 sum, as the matrix path's affine
            y = y + bias.view(1, -1, 1, 1)
        ctx.save_for_backward(x, weight)
        ctx.tables, ctx.conv, ctx.has_bias = t, conv, bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        t, conv = ctx.tables, ctx.conv
        (ph, pw) = conv.padding
        g = grad.to(x.dtype).contiguous()
        gp = padded(g, ph, pw)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:  # the tree over (C_out, kh, kw), as g's unfolded rows @ W
            gx = torch.empty_like(x)
            patches_times_weight(gp, weight, t, gx)
        if ctx.needs_input_grad[1]:  # the row tree over each sample's input pixels
            gw = weight_grad(x, gp, t, conv.stride, weight)
        if ctx.has_bias and ctx.needs_input_grad[2]:  # the row tree over output pixels
            gb = _cpu.channel_sums(g.view(g.shape[0], g.shape[1], -1)).to(weight.dtype)
        return gx, gw, gb, None


def conv_transpose2d_overlapping(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                 conv) -> torch.Tensor:
    """`conv`'s (a DetConvTranspose2d with k - s = 2·padding) transposed convolution of fp32
    NCHW `x` on the CPU, bitwise its matrix path."""
    return _GatherFoldConvTranspose2d.apply(x, weight, bias, conv)
