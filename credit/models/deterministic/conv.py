"""Deterministic convolutions on the CPU as gather GEMMs: no im2col matrix, no layout copies
(the transposed ones, built from these helpers: conv_transpose.py).

`DetConv2d` and `DetConvTranspose2d` (layers.py) define their arithmetic as GEMMs over
im2col rows and channels-last rows (`linear_local`): every output is the K tree of its
products, every weight and bias gradient the row tree over samples padded to whole leaves.
On the CPU the same GEMMs run through `credit.kernels.gemm._cpu.mm_gather`, whose operands
are offset tables into the tensors as they lie (the zero-padded input for a convolution's
patches, NCHW gradients, the output written straight into NCHW), so the im2col matrix and
its transposes are never materialised; the products, their order and every tree are the
matrix path's, so both paths give the same bits (tests/models/test_det_conv.py).

The input gradient of a stride-1 convolution with overlapping patches is defined as a
convolution (`input_grad_is_a_convolution`): g padded by k - 1 - p, times the weight flipped
and transposed, each element the K tree over (C_out, kh, kw). That is the product of patches
with the weight, which runs at the forward's speed, where patch gradients folded in col2im's
order wrote and re-read k·k times the input (1.2-1.9x slower on CREDIT's 3x3 convolutions).
Hand-written because torch has no convolution with a caller-fixed reduction order.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch
from torch.autograd.function import once_differentiable

from credit.kernels.gemm import LEAF
from credit.kernels.gemm import _cpu


def ar_steps(n: int, step: int = 1) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int64) * step


def padded_rows(per_sample: torch.Tensor, sample_stride: int, samples: int) -> torch.Tensor:
    """Offsets of every sample's rows, each sample padded with -1 (zero) to whole leaves, so a
    sample is a whole subtree of the row tree (what `pad_row_groups` does to a matrix)."""
    rows = per_sample.numel()
    width = -(-rows // LEAF) * LEAF if samples > 1 else rows
    table = torch.full((samples, width), -1, dtype=torch.int64)
    table[:, :rows] = ar_steps(samples, sample_stride)[:, None] + per_sample[None, :]
    return table.reshape(-1)


@functools.lru_cache(maxsize=64)
def conv_tables(b: int, c: int, hp: int, wp: int, c_out: int, ho: int, wo: int,
                 kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int]) -> SimpleNamespace:
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    plane, length, ckk = hp * wp, ho * wo, c * kh * kw
    # a patch's first element per output position, and each (c, i, j)'s offset from it
    corner = (ar_steps(ho, sh * wp)[:, None] + ar_steps(wo, sw)[None, :]).reshape(-1)
    kcol = (ar_steps(c, plane)[:, None, None] + ar_steps(kh, dh * wp)[None, :, None] + ar_steps(kw, dw)[None, None, :]).reshape(-1)
    positions = ar_steps(length)
    return SimpleNamespace(
        x_rows=(ar_steps(b, c * plane)[:, None] + corner[None, :]).reshape(-1), kcol=kcol,
        y_rows=(ar_steps(b, c_out * length)[:, None] + positions[None, :]).reshape(-1),
        dcols_rows=(ar_steps(b, ckk * length)[:, None] + positions[None, :]).reshape(-1),
        x_rows_padded=padded_rows(corner, c * plane, b),
        k_in_plane=kcol,  # (c, i, j) offsets in the input plane: dx's columns when patches do not overlap
        g_rows_padded=padded_rows(positions, c_out * length, b),
        k_ident=ar_steps(ckk), k_by_length=ar_steps(ckk, length),
        cout_by_ckk=ar_steps(c_out, ckk), cout_by_length=ar_steps(c_out, length), cout_ident=ar_steps(c_out),
    )


_PADDED: dict[tuple, torch.Tensor] = {}
_PADDED_KEPT_BYTES = 32 << 20  # padded buffers kept, in all (a model's convolutions use a few shapes)


def padded(x: torch.Tensor, ph: int, pw: int) -> torch.Tensor:
    """NCHW `x` zero-padded by (ph, pw), in a buffer kept per shape: its border is written once
    and stays zero, so a call copies only the interior (a fresh padded tensor cost a page
    fault per page, more than the copy: 0.4 ms a call inside a train step). Valid until the
    next call with the same shape: callers read it within one GEMM and never keep it. Kept
    up to 32 MiB in all (the oldest shapes dropped first), so large grids do not hold their
    pads through the step's peak."""
    if not (ph or pw):
        return x.contiguous()
    b, c, h, w = x.shape
    key = (b, c, h, w, ph, pw, x.dtype)
    buffer = _PADDED.get(key)
    if buffer is None:
        buffer = x.new_zeros((b, c, h + 2 * ph, w + 2 * pw))
        size = buffer.numel() * buffer.element_size()
        while _PADDED and size + sum(t.numel() * t.element_size() for t in _PADDED.values()) > _PADDED_KEPT_BYTES:
            _PADDED.pop(next(iter(_PADDED)))
        if size <= _PADDED_KEPT_BYTES:
            _PADDED[key] = buffer
    buffer[:, :, ph:ph + h, pw:pw + w].copy_(x)
    return buffer


def _ones_rows(rows: torch.Tensor) -> torch.Tensor:
    """Row table of a one-element ones vector: 0 for a real row, -1 for padding."""
    return torch.where(rows >= 0, 0, -1)


def bias_grad(g: torch.Tensor, g_rows_padded: torch.Tensor, channels: int, plane: int,
               dtype: torch.dtype) -> torch.Tensor:
    """Per-channel sum of NCHW `g` over the padded row tree (ones(1, rows) @ g_rows's bits)."""
    if g.dtype == torch.float32 and dtype == torch.float32:  # the same tree, read by channel planes
        return _cpu.channel_sums(g.view(g.shape[0], channels, plane))
    out = torch.empty(channels, dtype=dtype)
    one = torch.ones(1, dtype=g.dtype)
    _cpu.mm_gather(g.view(-1), ar_steps(channels, plane), g_rows_padded, one, _ones_rows(g_rows_padded),
                   torch.zeros(1, dtype=torch.int64), out, ar_steps(channels), torch.zeros(1, dtype=torch.int64))
    return out


_DCOLS_CHUNK_BYTES = 8 << 20  # patch gradients written at once (at least one sample's)


def input_grad(g: torch.Tensor, weight: torch.Tensor, t: SimpleNamespace, conv,
                shape: tuple[int, int, int, int], length: int, dtype: torch.dtype) -> torch.Tensor:
    """dx of an overlapping convolution: patch gradients (each the C_out tree of its products)
    folded in col2im's order.

    The patch gradients are computed as dcolsᵀ = Wᵀ @ g (rows: patch entries, columns: every
    sample's positions): the products and the tree of g @ W, so the same bits, but the output
    rows and g's rows are runs of positions, stored and packed as vectors (2x faster at C_out
    18, where g @ W's rows are scattered a plane apart).

    A few samples at a time: the patch gradients are k_h·k_w times the input, the largest
    buffer of a step when written for the whole batch; each element's tree is over C_out
    alone and each sample folds alone, so the bits do not depend on the split."""
    b, c, h, w = shape
    ckk = weight[0].numel()
    w_flat = weight.contiguous().view(-1)
    per_chunk = max(1, _DCOLS_CHUNK_BYTES // (ckk * length * torch.finfo(dtype).bits // 8))
    gx = torch.empty((b, c, h, w), dtype=dtype)
    buffer = torch.empty((min(per_chunk, b), ckk, length), dtype=dtype)  # reused: no page faults
    for start in range(0, b, per_chunk):
        n = min(per_chunk, b - start)
        dcols = buffer[:n]
        # sample-major tables: the first n samples' rows, read from this chunk's first sample
        _cpu.mm_gather(w_flat, t.k_ident, t.cout_by_ckk, g[start:start + n].reshape(-1),
                       t.cout_by_length, t.y_rows[:n * length], dcols.view(-1), t.k_by_length,
                       t.dcols_rows[:n * length])
        _cpu.fold(dcols, (h, w), conv.kernel_size, conv.padding, conv.stride, conv.dilation,
                  out=gx[start:start + n])
    return gx


def _fills_panels(c_out: int) -> bool:
    """Whether C_out output columns fill whole column panels of the kernel's tile: the wide
    tile's, or the one narrow panel it takes for outputs of at most half its width."""
    mod = _cpu.load()
    return c_out % mod.nr == 0 or c_out == mod.narrow_nr


def _weight_rows_faster(c_out: int, length: int) -> bool:
    """Whether a forward runs faster as W @ patches than as patches @ Wᵀ (the same bits
    either way): when C_out does not fill whole column panels of the kernel's tile, or
    a plane has fewer positions than a panel and a leaf (measured on CREDIT's shapes on an
    AVX2 Zen 3, panels of 16, and an AVX-512 Zen 4, panels of 64 and a narrow one of 32:
    C_out = 32 1.2-1.6x faster as patches @ Wᵀ)."""
    return not _fills_panels(c_out) or length < min(_cpu.load().nr, LEAF)


def _weight_grad_as_g_rows(c_out: int, length: int, stride: tuple[int, int]) -> bool:
    """Whether dW runs faster as g @ patches than as (patchesᵀ @ g)ᵀ (the same bits either
    way): when a sample has fewer positions than a leaf, when C_out does not fill whole
    column panels, or when the stride spaces a patch row's positions apart (patchesᵀ's
    leaves are then packed; g's rows are runs of positions read in place). Measured on
    CREDIT's convolution shapes at 32x64 and 64x128 on an AVX-512 Zen 4 (1.4-1.7x faster
    where it applies, at most 0.1 ms slower on two small strided shapes)."""
    return length < LEAF or not _fills_panels(c_out) or tuple(stride) != (1, 1)


def input_grad_is_a_convolution(conv) -> bool:
    """Whether dx is defined as the convolution of g by the flipped, transposed weight: stride
    and dilation 1, overlapping patches, padding at most k - 1 on each side."""
    return (tuple(conv.stride) == (1, 1) and tuple(conv.dilation) == (1, 1) and not _disjoint_patches(conv)
            and all(p <= k - 1 for k, p in zip(conv.kernel_size, conv.padding)))


def adjoint_padding(conv) -> tuple[int, int]:
    """The padding of g in that convolution: k - 1 - p on each side."""
    return tuple(k - 1 - p for k, p in zip(conv.kernel_size, conv.padding))


def adjoint_weight(weight: torch.Tensor) -> torch.Tensor:
    """(C_in, C_out, kh, kw): the weight flipped in both kernel dimensions, its channels swapped."""
    return weight.flip(2, 3).transpose(0, 1).contiguous()


def _disjoint_patches(conv) -> bool:
    """No padding and a stride of at least the kernel: every input pixel in at most one patch."""
    return (conv.padding == (0, 0) and conv.dilation == (1, 1)
            and all(s >= k for s, k in zip(conv.stride, conv.kernel_size)))


def patches_times_weight(xp: torch.Tensor, weight: torch.Tensor, t: SimpleNamespace,
                          y: torch.Tensor, bias: torch.Tensor | None = None,
                          weight_tables: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """y (B, C_out, H_o, W_o) = the convolution of the padded input `xp` by `weight`: each
    output the tree over its patch's (c, i, j) products, plus `bias` (added to the fp32 sum
    before its one rounding). `weight_tables`: (per output channel, per (c, i, j)) offsets
    into `weight` when it is read in another layout (the adjoint's flipped, transposed
    weight, read in place)."""
    w_flat = weight.contiguous().view(-1)
    w_rows, w_cols = weight_tables if weight_tables is not None else (t.cout_by_ckk, t.k_ident)
    c_out, length = w_rows.numel(), y.shape[-2] * y.shape[-1]
    if _weight_rows_faster(c_out, length):  # y = W @ patches: the same products and tree
        _cpu.mm_gather(w_flat, w_rows, w_cols, xp.view(-1), t.kcol, t.x_rows,
                       y.view(-1), t.cout_by_length, t.y_rows, bias=bias, bias_on_rows=True)
    else:  # y = patches @ Wᵀ
        _cpu.mm_gather(xp.view(-1), t.x_rows, t.kcol, w_flat, w_cols, w_rows,
                       y.view(-1), t.y_rows, t.cout_by_length, bias=bias)


@functools.lru_cache(maxsize=64)
def _adjoint_weight_tables(c_out: int, c_in: int, kh: int, kw: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`adjoint_weight(W)`'s rows and columns as offsets into W (C_out, C_in, kh, kw) itself:
    row c at c·kh·kw, column (o, i, j) at o·C_in·kh·kw + (kh-1-i)·kw + (kw-1-j), so the
    adjoint convolution reads W in place (the flipped copy cost up to 1 ms a call)."""
    rows = ar_steps(c_in, kh * kw)
    cols = (ar_steps(c_out, c_in * kh * kw)[:, None, None] + ar_steps(kh, kw).flip(0)[None, :, None]
            + ar_steps(kw).flip(0)[None, None, :]).reshape(-1)
    return rows, cols


def weight_grad(g: torch.Tensor, xp: torch.Tensor, t: SimpleNamespace, stride: tuple[int, int],
                 weight: torch.Tensor) -> torch.Tensor:
    """dW of the convolution of padded `xp` with output gradient `g`: dWᵀ = patchesᵀ @ g, the
    row tree over every sample's positions padded to whole leaves."""
    c_out, length = weight.shape[0], g.shape[-2] * g.shape[-1]
    gw = torch.empty(weight.shape, dtype=weight.dtype)
    if _weight_grad_as_g_rows(c_out, length, stride):  # dW = g @ patches
        _cpu.mm_gather(g.view(-1), t.cout_by_length, t.g_rows_padded, xp.view(-1),
                       t.x_rows_padded, t.kcol, gw.view(-1), t.cout_by_ckk, t.k_ident)
    else:
        _cpu.mm_gather(xp.view(-1), t.kcol, t.x_rows_padded, g.view(-1), t.g_rows_padded,
                       t.cout_by_length, gw.view(-1), t.k_ident, t.cout_by_ckk)
    return gw


class _GatherConv2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, conv):  # type: ignore[override]
        (ph, pw), kernel = conv.padding, conv.kernel_size
        b, c, h, w = x.shape
        xp = padded(x, ph, pw)
        hp, wp = xp.shape[-2:]
        ho = (hp - conv.dilation[0] * (kernel[0] - 1) - 1) // conv.stride[0] + 1
        wo = (wp - conv.dilation[1] * (kernel[1] - 1) - 1) // conv.stride[1] + 1
        c_out = weight.shape[0]
        t = conv_tables(b, c, hp, wp, c_out, ho, wo, kernel, conv.stride, conv.dilation)
        y = torch.empty((b, c_out, ho, wo), dtype=x.dtype)
        patches_times_weight(xp, weight, t, y, bias)  # bias added to the fp32 sums
        # x, not its padded copy: the layer before usually keeps x for its own backward, and
        # padding it again there costs one copy
        ctx.save_for_backward(x, weight)
        ctx.tables, ctx.conv, ctx.shape, ctx.has_bias = t, conv, (b, c, h, w, ho, wo), bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        t, conv = ctx.tables, ctx.conv
        (ph, pw) = conv.padding
        b, c, h, w, ho, wo = ctx.shape
        length = ho * wo
        g = grad.to(x.dtype).contiguous()
        gx = gw = gb = None
        # dW first: its padded input is a kept buffer that padding g (the same shape when
        # C_in = C_out) would overwrite
        if ctx.needs_input_grad[1]:
            gw = weight_grad(g, padded(x, ph, pw), t, conv.stride, weight)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = bias_grad(g, t.g_rows_padded, weight.shape[0], length, weight.dtype)
        if ctx.needs_input_grad[0] and _disjoint_patches(conv):
            # each input pixel is in at most one patch: its gradient is written in place;
            # + 0.0 rounds -0 to +0 exactly as fold's sum into zeros does
            gx = torch.zeros((b, c, h, w), dtype=x.dtype)
            _cpu.mm_gather(g.view(-1), t.y_rows, t.cout_by_length, weight.contiguous().view(-1),
                           t.cout_by_ckk, t.k_ident, gx.view(-1), t.x_rows, t.k_in_plane)
            gx.add_(0.0)
        elif ctx.needs_input_grad[0] and input_grad_is_a_convolution(conv):
            (qh, qw), kernel = adjoint_padding(conv), conv.kernel_size
            gp = padded(g, qh, qw)
            adjoint = conv_tables(b, weight.shape[0], ho + 2 * qh, wo + 2 * qw, c, h, w, kernel,
                                   (1, 1), (1, 1))
            gx = torch.empty((b, c, h, w), dtype=x.dtype)
            patches_times_weight(gp, weight, adjoint, gx,
                                  weight_tables=_adjoint_weight_tables(weight.shape[0], c, *kernel))
        elif ctx.needs_input_grad[0]:  # patch gradients (tree over C_out), then fold
            gx = input_grad(g, weight, t, conv, (b, c, h, w), length, x.dtype)
        return gx, gw, gb, None


def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv) -> torch.Tensor:
    """`conv`'s (a DetConv2d) convolution of NCHW `x` on the CPU, bitwise its matrix path."""
    return _GatherConv2d.apply(x, weight, bias, conv)
