"""Spectral-norm arithmetic on one rank's block of a weight matrix (sharded or whole).

The weight is viewed as a matrix W (h, w). A rank holds all of it, a block of rows
(ColwiseParallel: Shard(0)) or a block of columns (RowwiseParallel: Shard(1)), and keeps
the power-iteration vectors u (h) and v (w) whole, identical on every rank. Each matrix
product is computed on the local block; a result split by the block (W v under a row split,
Wᵀu under a column split) is gathered whole, and a sum split by the block (Wᵀu under a row
split, W v under a column split) is formed from per-rank float32 partials added in rank
order by the GEMM's K tree. Norms, σ = uᵀ W v and the updates then run on whole vectors,
exactly as in one process.

Fast mode on a whole weight (one process, or a layer tensor parallelism leaves whole) takes
torch's own fused calls (`F.normalize`, `torch.mv`, `torch.dot`): about half the operations,
which matters because the normalisation runs per layer per step and a GPU step of CREDIT's
1-degree wxformer spent more host time launching it than the GPU spent computing the model.

With `deterministic=True` the products are the fixed-tree GEMM (`det_mm`), whose K tree
split into 2, 4 or 8 equal 32-aligned parts equals the rank-order tree of the parts: σ, u,
v, the normalised weight and its gradient are then bitwise the one-process values. Fast
mode uses torch's products: equal to one process within float32 reassociation.

Hand-written: torch's spectral norm (hook or parametrization) needs the whole weight and
cannot run on DTensor shards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from credit.kernels.gemm import det_mm
from credit.kernels.gemm._tree import tree_sum


@dataclass(frozen=True)
class Block:
    """Where this rank's block of W lies: `split` is "rows", "cols" or "none" (whole W);
    `start` its first row/column; `group` the ranks holding the other blocks."""

    split: str = "none"
    start: int = 0
    group: dist.ProcessGroup | None = None


WHOLE = Block()


def _gather(local: torch.Tensor, group: dist.ProcessGroup) -> list[torch.Tensor]:
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local.contiguous(), group=group)
    return parts


def _whole(local: torch.Tensor, block: Block, split_by_block: bool) -> torch.Tensor:
    """The whole vector from this rank's piece: concatenated when the block splits the
    result, summed in rank order (the K tree's top levels) when it splits the sum."""
    if block.split == "none":
        return local
    parts = _gather(local, block.group)
    return torch.cat(parts) if split_by_block else tree_sum(parts)


class Products:
    """Matrix-vector products in float32: the fixed-tree GEMM or torch's."""

    def __init__(self, deterministic: bool) -> None:
        self.deterministic = deterministic

    def mv(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """a (m, k) @ x (k,) -> (m,)"""
        if self.deterministic:
            return det_mm(a.contiguous(), x.reshape(-1, 1).contiguous(), out_dtype=torch.float32)[:, 0]
        return a @ x

    def vm(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """x (k,) @ a (k, n) -> (n,)"""
        if self.deterministic:
            return det_mm(x.reshape(1, -1).contiguous(), a.contiguous(), out_dtype=torch.float32)[0]
        return x @ a

    def dot(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.vm(x, y.reshape(-1, 1))[0]

    def normalize(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        return x / self.dot(x, x).sqrt().clamp_min(eps)

    def fused(self, block: Block) -> bool:
        """Whether torch's fused calls may stand in (fast mode on a whole weight)."""
        return not self.deterministic and block.split == "none"


def _rows(u: torch.Tensor, w: torch.Tensor, block: Block) -> torch.Tensor:
    return u[block.start: block.start + w.shape[0]] if block.split == "rows" else u


def _cols(v: torch.Tensor, w: torch.Tensor, block: Block) -> torch.Tensor:
    return v[block.start: block.start + w.shape[1]] if block.split == "cols" else v


def w_times_v(w: torch.Tensor, v: torch.Tensor, block: Block, products: Products) -> torch.Tensor:
    """W v, whole (h,), from the local block `w` (float32)."""
    return _whole(products.mv(w, _cols(v, w, block)), block, split_by_block=block.split == "rows")


def wt_times_u(w: torch.Tensor, u: torch.Tensor, block: Block, products: Products) -> torch.Tensor:
    """Wᵀ u, whole (w,), from the local block `w` (float32)."""
    return _whole(products.vm(_rows(u, w, block), w), block, split_by_block=block.split == "cols")


@torch.no_grad()
def power_iterate(w: torch.Tensor, u: torch.Tensor, v: torch.Tensor, block: Block,
                  products: Products, iterations: int, eps: float) -> torch.Tensor:
    """`iterations` (>= 1) steps of v <- normalize(Wᵀu), u <- normalize(W v), in place.
    Returns the last W v, from which σ follows without another collective."""
    w = w.detach().float()
    if products.fused(block):
        for _ in range(iterations):
            v.copy_(F.normalize(torch.mv(w.t(), u), dim=0, eps=eps))
            wv = torch.mv(w, v)
            u.copy_(F.normalize(wv, dim=0, eps=eps))
        return wv
    for _ in range(iterations):
        v.copy_(products.normalize(wt_times_u(w, u, block, products), eps))
        wv = w_times_v(w, v, block, products)
        u.copy_(products.normalize(wv, eps))
    return wv


@torch.no_grad()
def sigma(w: torch.Tensor, u: torch.Tensor, v: torch.Tensor, block: Block, products: Products,
          wv: torch.Tensor | None = None) -> torch.Tensor:
    """σ = uᵀ W v (float32 scalar, the same on every rank); `wv`: W v if already known
    (the same bits as computing it again)."""
    if wv is None:
        wv = w_times_v(w.detach().float(), v, block, products)
    return torch.dot(u, wv) if products.fused(block) else products.dot(u, wv)


def normalization_backward(w: torch.Tensor, grad: torch.Tensor, u: torch.Tensor, v: torch.Tensor, s: torch.Tensor,
                           block: Block, products: Products) -> torch.Tensor:
    """dL/dW = G / σ - (Σ G∘W / σ²) u vᵀ for G = dL/d(W/σ) (float32), the sum over the whole
    W: row sums of the block, made whole like W v, then added in a fixed order."""
    g, w32 = grad.float(), w.float()
    if products.fused(block):  # the same arithmetic in three fused calls
        total = torch.dot(g.reshape(-1), w32.reshape(-1))
        return (g - (total / s) * torch.outer(u, v)) / s
    ones = torch.ones(w32.shape[1], dtype=torch.float32, device=w32.device)
    row_sums = _whole(products.mv(g * w32, ones), block, split_by_block=block.split == "rows")
    total = products.dot(row_sums, torch.ones_like(row_sums))
    outer = torch.outer(_rows(u, w32, block), _cols(v, w32, block))
    return g / s - (total / (s * s)) * outer


class _Normalize(torch.autograd.Function):
    """W / σ with σ = uᵀ W v (u, v constants); backward `normalization_backward`. With a
    `deferred` dict the backward hands G = dL/d(W/σ) on unchanged and the forward leaves σ,
    u, v in the dict, for `normalization_backward` once G is summed over every sample
    (`credit.models.spectral_norm.finish_spectral_norm_gradients`)."""

    @staticmethod
    def forward(ctx, w, u, v, block, products, wv, deferred):  # type: ignore[override]
        s = sigma(w, u, v, block, products, wv)
        ctx.save_for_backward(w, u, v, s)
        ctx.block, ctx.products, ctx.deferred = block, products, deferred is not None
        if deferred is not None:
            deferred.update(s=s, u=u, v=v)
        return (w.float() / s).to(w.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        if ctx.deferred:
            return grad, None, None, None, None, None, None
        w, u, v, s = ctx.saved_tensors
        grad_w = normalization_backward(w, grad, u, v, s, ctx.block, ctx.products)
        return grad_w.to(w.dtype), None, None, None, None, None, None


def normalized(w: torch.Tensor, u: torch.Tensor, v: torch.Tensor, block: Block,
               products: Products, wv: torch.Tensor | None = None, deferred: dict | None = None) -> torch.Tensor:
    """The local block of W / σ, differentiable in `w` (u and v are read, not changed);
    `wv`: W v when already known (saves its collective); `deferred`: see `_Normalize`."""
    return _Normalize.apply(w, u.detach().clone(), v.detach().clone(), block, products, wv, deferred)
