"""The im2col convolution of deterministic mode in bounded memory: slabs of output rows.

The definition (`layers._unfolded_conv2d`, the path of every backend but the CPU's gather
kernels): each output is its im2col row times the weight by the GEMM (K a whole reduction:
`layers.WHOLE`), the weight gradient is the GEMM's row tree over each sample's positions
padded to whole leaves, and the input gradient is the patch gradients folded in col2im's
order. Its im2col matrix grows with
the kernel's area: CREDIT's 1-degree cross-embedding (79 channels, a 32 x 32 kernel, 128 x 256
outputs) makes one of 10.6 GB in fp32, which autograd kept for backward beside its gradient
(the deterministic step peaked at 13.5x the fast one's memory on an H200).

Here the same arithmetic runs on slabs of at most `budget` bytes of im2col rows, and only the
input is kept for backward (its patches are unfolded again):
- forward: a GEMM row never depends on the other rows, so slabs of output rows give its bits;
- weight gradient: the row tree T(n) = T(ceil(n/2)) + T(floor(n/2)) over n leaves is split
  on the host at its own split points until a subtree's rows fit, each subtree one GEMM over
  its rows and the halves added in fp32, exactly as the tree adds them;
- input gradient: each slab of input rows is folded from every output row whose patches
  reach it, so each pixel sums the same terms in col2im's order. A slab is at least one
  patch high (a 32-row kernel at stride 2: 32 output rows at a time), so where those rows'
  patch gradients pass `budget` (CREDIT's 1-degree cross-embedding, when its input needs a
  gradient: 2.1 GB, in nextgen_wxformer) the slab is cut into columns the same way, at
  least a patch wide. Folds write into a tensor of their own size (`fold`): col2im's
  own output keeps a storage as large as its columns.
The bits equal the definition's on every backend (tests/models/test_det_conv_slabs.py).
Hand-written because torch has no convolution with a caller-fixed reduction order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from credit.kernels.gemm import LEAF, left_leaves
from credit.kernels.gemm._ops import _mm, linear_local, row_sum
from credit.kernels.gemm._registry import resolve
from credit.models.deterministic.conv import adjoint_weight

SLAB_BYTES = 64 << 20
"""im2col bytes a slab holds at most (a convolution whose whole matrix fits runs unsliced).
At 256 MiB the decoder's 3x3 weight gradients and the cross-embeddings' slabs set the step's
peak at 1 degree; 32 MiB was no better overall, nextgen_wxformer's fold slabs being then
recomputed more often (`benchmarks/step_memory.py`, docs/gpu.md)."""


class _Slabs:
    """A convolution's sizes, and its patches unfolded for a range of output rows."""

    def __init__(self, x: torch.Tensor, c_out: int, geometry, budget: int) -> None:
        self.b, self.c_in, self.h, self.w = x.shape
        (self.kh, self.kw), (self.sh, self.sw) = geometry.kernel_size, geometry.stride
        (self.ph, self.pw), (self.dh, self.dw) = geometry.padding, geometry.dilation
        self.hp, self.wp = self.h + 2 * self.ph, self.w + 2 * self.pw
        self.ho = (self.hp - self.dh * (self.kh - 1) - 1) // self.sh + 1
        self.wo = (self.wp - self.dw * (self.kw - 1) - 1) // self.sw + 1
        self.k = self.c_in * self.kh * self.kw
        self.c_out = c_out
        self.budget, self.elem = budget, x.element_size()
        row_bytes = self.wo * self.k * x.element_size()  # one output row's patches, one sample
        self.rows = max(1, budget // max(1, row_bytes * self.b))  # output rows a slab holds
        self.leaf_rows = max(1, budget // max(1, self.k * x.element_size()))  # GEMM rows a subtree holds

    def patch_view(self, xp: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
        """(samples, r1 - r0, wo, C_in, kh, kw): the patches of output rows r0 .. r1 - 1 as a
        strided view of the contiguous zero-padded input `xp` (no copy; flattened over
        (C_in, kh, kw) these are F.unfold's columns, in its order)."""
        s_b, s_c, s_h, s_w = xp.stride()
        return xp.as_strided((xp.shape[0], r1 - r0, self.wo, self.c_in, self.kh, self.kw),
                             (s_b, self.sh * s_h, self.sw * s_w, s_c, self.dh * s_h, self.dw * s_w),
                             xp.storage_offset() + r0 * self.sh * s_h)

    def patches(self, xp: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
        """(samples, (r1 - r0) x wo, K): the im2col rows of output rows r0 .. r1 - 1 of the
        zero-padded input `xp`, copied once from the strided view (F.unfold and its transpose
        held two copies)."""
        return self.patch_view(xp, r0, r1).reshape(xp.shape[0], (r1 - r0) * self.wo, self.k)

    def forward(self, xp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                backend: str) -> torch.Tensor:
        y = xp.new_empty((self.b, self.c_out, self.ho, self.wo))
        w2 = weight.reshape(self.c_out, -1)
        for r0 in range(0, self.ho, self.rows):
            r1 = min(self.ho, r0 + self.rows)
            part = linear_local(self.patches(xp, r0, r1), w2, bias, backend, whole=(True, True))
            y[:, :, r0:r1] = part.transpose(1, 2).reshape(self.b, self.c_out, r1 - r0, self.wo)
        return y

    def input_grad(self, g_rows: torch.Tensor, weight: torch.Tensor, backend: str) -> torch.Tensor:
        """dx from g's rows (samples, ho x wo, C_out): slabs of padded input rows, each folded
        from all the output rows that reach it, and where one such slab's patch gradients pass
        the budget (a tall kernel on a wide grid), slabs of its columns likewise."""
        reach, reach_w = self.dh * (self.kh - 1), self.dw * (self.kw - 1)  # a patch's span, less one
        # input rows a slab folds: at least a patch's height, so each patch gradient is computed
        # at most about twice (a slab needs every output row whose patch reaches it; a 32-row
        # kernel at stride 2 would otherwise recompute each 16 times)
        height = max((self.rows - 1) * self.sh - reach + 1, reach + 1)
        width = self._fold_width(height, reach, reach_w)
        w2 = weight.reshape(self.c_out, -1)
        g_grid = g_rows.view(self.b, self.ho, self.wo, self.c_out)
        gxp = g_rows.new_zeros((self.b, self.c_in, self.hp, self.wp))
        for i0 in range(0, self.hp, height):
            i1 = min(self.hp, i0 + height)
            r_lo, r_hi = self._reaching(i0, i1, reach, self.sh, self.ho)
            for j0 in range(0, self.wp, width):
                j1 = min(self.wp, j0 + width)
                c_lo, c_hi = self._reaching(j0, j1, reach_w, self.sw, self.wo)
                if r_lo >= r_hi or c_lo >= c_hi:
                    continue  # pixels no patch reaches keep a zero gradient
                rows = g_grid[:, r_lo:r_hi, c_lo:c_hi].reshape(-1, self.c_out)
                cols = _mm(rows, w2, backend, g_rows.dtype, whole=True)  # over C_out, as the definition's
                del rows
                top, span = r_lo * self.sh, (r_hi - 1 - r_lo) * self.sh + reach + 1
                left, span_w = c_lo * self.sw, (c_hi - 1 - c_lo) * self.sw + reach_w + 1
                folded = fold(cols.view(self.b, -1, self.k).transpose(1, 2), (span, span_w), (self.kh, self.kw),
                              (self.dh, self.dw), stride=(self.sh, self.sw))
                del cols  # before the next slab's are made
                # each pixel sums the patches that cover it, all inside this rectangle, in
                # col2im's order; rows and columns between patches or past the last stay zero
                start, end = max(i0, top), min(i1, top + span)
                first, last = max(j0, left), min(j1, left + span_w)
                if start < end and first < last:
                    gxp[:, :, start:end, first:last] = folded[:, :, start - top:end - top, first - left:last - left]
                del folded
        return gxp[:, :, self.ph:self.ph + self.h, self.pw:self.pw + self.w]

    @staticmethod
    def _reaching(i0: int, i1: int, reach: int, stride: int, outputs: int) -> tuple[int, int]:
        """The outputs [lo, hi) along one dimension whose patches reach input positions [i0, i1)."""
        return max(0, -(-(i0 - reach) // stride)), min(outputs, (i1 - 1) // stride + 1)

    def _fold_width(self, height: int, reach: int, reach_w: int) -> int:
        """Input columns a fold slab spans: all of them while the patch gradients of `height`
        rows fit the budget, else as many as fit, at least a patch's width."""
        out_rows = min(self.ho, (height + reach - 1) // self.sh + 1)
        per_column = self.b * out_rows * self.k * self.elem  # (fold copies them a few channels at a time)
        columns = self.budget // max(1, per_column)  # output columns whose patch gradients fit
        if columns >= self.wo:
            return self.wp
        return max((columns - 1) * self.sw - reach_w + 1, reach_w + 1)

    def weight_grad(self, xp: torch.Tensor, g_rows: torch.Tensor, backend: str) -> torch.Tensor:
        """dW (C_out, K): the row tree over the samples' positions, each sample padded to
        whole leaves, split at the tree's own nodes into subtrees that fit."""
        positions = self.ho * self.wo
        padded = -(-positions // LEAF) * LEAF
        leaves = self.b * padded // LEAF

        view = self.patch_view(xp, 0, self.ho)  # (samples, ho, wo, C_in, kh, kw), no copy
        block = (self.c_in, self.kh, self.kw)

        def rows_of(q0: int, q1: int) -> tuple[torch.Tensor, torch.Tensor]:
            g = g_rows.new_zeros((q1 - q0, self.c_out))
            cols = xp.new_zeros((q1 - q0, self.k))
            for s in range(q0 // padded, (q1 - 1) // padded + 1):
                p0, p1 = max(q0 - s * padded, 0), min(q1 - s * padded, positions)
                if p0 >= p1:
                    continue  # padding rows only
                at = s * padded + p0 - q0
                g[at:at + p1 - p0] = g_rows[s, p0:p1]
                # positions p0 .. p1 - 1 copied straight from the view into cols: a partial
                # first output row, whole rows, a partial last row
                p = p0
                while p < p1:
                    r, c = divmod(p, self.wo)
                    start = at + p - p0
                    if c == 0 and p1 - p >= self.wo:  # whole output rows
                        n_rows = (p1 - p) // self.wo
                        cols[start:start + n_rows * self.wo].view(n_rows, self.wo, *block).copy_(view[s, r:r + n_rows])
                        p += n_rows * self.wo
                    else:
                        n = min(self.wo - c, p1 - p)
                        cols[start:start + n].view(n, *block).copy_(view[s, r, c:c + n])
                        p += n
            return g, cols

        def subtree(lo: int, hi: int) -> torch.Tensor:
            if hi - lo == 1 or (hi - lo) * LEAF <= self.leaf_rows:
                g, cols = rows_of(lo * LEAF, hi * LEAF)
                return _mm(g.t(), cols, backend, torch.float32)
            mid = lo + left_leaves(hi - lo)
            return subtree(lo, mid) + subtree(mid, hi)

        return subtree(0, leaves)


def fold(cols: torch.Tensor, size: tuple[int, int], kernel_size, dilation=(1, 1), padding=(0, 0),
         stride=(1, 1), chunk_bytes: int = 16 << 20) -> torch.Tensor:
    """F.fold's values and bits into a tensor of its own size. F.fold's col2im makes its output
    like its (samples, C·kh·kw, positions) input and then shrinks it, so the result keeps a
    storage as large as the columns (an im2col matrix held by a gradient or a slab); and it
    copies columns that are not contiguous (a GEMM's output, transposed) whole. Such columns
    are folded here a few channels at a time (each channel's pixels sum only its own columns,
    in the same order), so the copy holds at most about `chunk_bytes`."""
    kernel = kernel_size[0] * kernel_size[1]
    out = cols.new_empty((cols.shape[0], cols.shape[1] // kernel, *size))
    args = list(size), list(kernel_size), list(dilation), list(padding), list(stride)
    if cols.is_contiguous():
        return torch.ops.aten.col2im.out(cols, *args, out=out)
    per_channel = cols.shape[0] * kernel * cols.shape[2] * cols.element_size()
    step = max(1, chunk_bytes // max(1, per_channel))
    for c0 in range(0, out.shape[1], step):
        c1 = min(out.shape[1], c0 + step)
        part = cols[:, c0 * kernel:c1 * kernel].contiguous()
        out[:, c0:c1] = torch.ops.aten.col2im.out(part, *args, out=out.new_empty((out.shape[0], c1 - c0, *size)))
        del part
    return out


def patch_rows(x: torch.Tensor, c_out: int, geometry) -> torch.Tensor:
    """(samples x positions, K): every im2col row of `x` (F.unfold's, transposed), one copy."""
    slabs = _Slabs(x, c_out, geometry, SLAB_BYTES)
    xp = F.pad(x, (slabs.pw, slabs.pw, slabs.ph, slabs.ph))
    return slabs.patches(xp, 0, slabs.ho).reshape(-1, slabs.k)


def convolution_in_slabs(x: torch.Tensor, weight: torch.Tensor, geometry, backend: str,
                         budget: int = SLAB_BYTES) -> torch.Tensor:
    """The definition's forward convolution of `x` (no bias, no autograd), slabs of output rows
    of at most `budget` im2col bytes (one slab where all fit): a stride-1 convolution's dx, the
    convolution of g, whose im2col rows can pass the budget where x's did not (C_out > C_in)."""
    slabs = _Slabs(x, weight.shape[0], geometry, budget)
    xp = F.pad(x, (slabs.pw, slabs.pw, slabs.ph, slabs.ph))
    return slabs.forward(xp, weight, None, resolve(backend, x.device))


def fits(x: torch.Tensor, weight: torch.Tensor, geometry, budget: int = SLAB_BYTES) -> bool:
    """Whether the whole im2col matrix of this convolution is within `budget` bytes."""
    slabs = _Slabs(x, weight.shape[0], geometry, budget)
    return slabs.rows >= slabs.ho and slabs.leaf_rows >= slabs.b * slabs.ho * slabs.wo


class _SlabConv2d(torch.autograd.Function):
    """The definition's convolution, forward and backward, a slab at a time."""

    @staticmethod
    def forward(ctx, x, weight, bias, geometry, adjoint, budget, backend):  # type: ignore[override]
        slabs = _Slabs(x, weight.shape[0], geometry, budget)
        xp = F.pad(x, (slabs.pw, slabs.pw, slabs.ph, slabs.ph))
        ctx.save_for_backward(x, weight)
        ctx.slabs, ctx.has_bias, ctx.adjoint, ctx.budget = slabs, bias is not None, adjoint, budget
        ctx.backend = resolve(backend, x.device)
        return slabs.forward(xp, weight, bias, ctx.backend)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        slabs = ctx.slabs
        backend = ctx.backend
        g = grad.to(x.dtype)
        # the GEMM's rows: (sample, position), channels last
        g_rows = g.reshape(slabs.b, slabs.c_out, -1).transpose(1, 2).contiguous()
        gx = gw = gb = None
        if ctx.needs_input_grad[0] and ctx.adjoint is not None:  # dx defined as a convolution of g
            adjoint = ctx.adjoint
            gx = convolution_in_slabs(g, adjoint_weight(weight), adjoint, backend, ctx.budget)
        elif ctx.needs_input_grad[0]:
            gx = slabs.input_grad(g_rows, weight, backend)
        if ctx.needs_input_grad[1]:
            xp = F.pad(x, (slabs.pw, slabs.pw, slabs.ph, slabs.ph))
            gw = slabs.weight_grad(xp, g_rows, backend).to(x.dtype).view(weight.shape)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = row_sum(g_rows.view(-1, slabs.c_out), slabs.b, backend, x.dtype)
        return gx, gw, gb, None, None, None, None


def slab_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, geometry,
                adjoint=None, budget: int = SLAB_BYTES, backend: str = "auto") -> torch.Tensor:
    """The matrix path's convolution and gradients, bitwise, holding at most `budget` bytes
    of im2col rows at a time. `adjoint`: the geometry whose convolution of g by the flipped,
    transposed weight defines dx (`layers._StrideOneConv2d`); None: dx is the patch
    gradients folded in col2im's order (`layers._unfolded_conv2d`)."""
    return _SlabConv2d.apply(x, weight, bias, geometry, adjoint, budget, backend)
