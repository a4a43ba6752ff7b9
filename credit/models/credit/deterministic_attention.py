"""The attention of CREDIT's blocks in deterministic mode (`model.gemm=deterministic`).

What differs from the fast path (torch's SDPA with the position bias as its mask), and why:

- q kᵀ, softmax and p v are written out per head on contiguous operands, as the windowformer's
  deterministic attention is, so nothing depends on how many heads a tensor-parallel rank
  holds; dropout on the probabilities is `IndexedDropout`, indexed by global head.
- The position bias is computed per sample (the position-bias MLP runs on each sample's copy
  of the offset table, its rows grouped by sample), so the reduction over the batch happens
  once, inside the MLP's fixed-tree weight gradients, where a split of the batch at sample
  boundaries is a split of that tree.
- Each sample's bias gradient adds its (head, window) score gradients with the GEMM's row
  tree, each head's windows padded to whole leaves, so a rank holding a block of the heads
  computes a subtree; the tensor-parallel ranks' subtrees are then added in rank order
  (the tree's top levels). Hand-written because autograd's sum of a broadcast reduces in an
  order that depends on the local head count.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from credit.kernels.gemm._dtensor import _tree_reduce
from credit.kernels.gemm._ops import row_sum
from credit.kernels.gemm._registry import resolve
from credit.models.dropout import IndexedDropout


class _HeadSharedBias(torch.autograd.Function):
    """scores (B, windows, heads, L, L) + bias (B, L, L) for every window and head."""

    @staticmethod
    def forward(ctx, scores, bias, group):  # type: ignore[override]
        ctx.group = group
        return scores + bias[:, None, None]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        b, windows, heads, length, _ = grad.shape
        backend = resolve("auto", grad.device)
        # per sample: rows ordered (head, window), each head's windows one group of the tree;
        # the samples side by side as columns, one call (a column's sum is the same alone)
        rows = grad.permute(2, 1, 0, 3, 4).reshape(heads * windows, b * length * length)
        per_sample = row_sum(rows, heads, backend, grad.dtype).view(b, length * length)
        if ctx.group is not None and dist.get_world_size(ctx.group) > 1:
            per_sample = _tree_reduce(per_sample, ctx.group)
        return grad, per_sample.view(b, length, length), None


def windowed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, *,
                       dim_head: int, dropout: IndexedDropout, training: bool, head_offset: int,
                       global_heads: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    """softmax(q kᵀ/√d + bias) v over windows of (n, L, width) q/k/v (n = B · windows per
    sample, sample-major) with this rank's heads (width / dim_head of them, the first being
    global head `head_offset`); bias (B, L, L) is shared by every head and window of a sample.
    Returns (n, L, width)."""
    n, length, width = q.shape
    heads, batch = width // dim_head, bias.shape[0]

    def split_heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(n, length, heads, dim_head).transpose(1, 2).contiguous()

    q, k, v = split_heads(q), split_heads(k), split_heads(v)
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(dim_head))
    scores = _HeadSharedBias.apply(scores.view(batch, n // batch, heads, length, length), bias, group)
    probs = torch.softmax(scores.view(n, heads, length, length), dim=-1)
    if training and dropout.p > 0.0:
        mask = dropout(torch.ones((n, length * length, heads), dtype=probs.dtype, device=probs.device),
                       col_offset=head_offset, global_cols=global_heads)
        probs = probs * mask.view(n, length, length, heads).permute(0, 3, 1, 2)
    return torch.matmul(probs, v).transpose(1, 2).reshape(n, length, width)


ATTENTION_CHUNK_BYTES = 32 << 20
"""Bytes of (L, L) scores that recomputed attention makes at a time."""


class _RecomputedAttention(torch.autograd.Function):
    """softmax(q kᵀ · scale) v that keeps q, k and v for backward, not the probabilities, and
    makes the (L, L) scores a chunk of (sample, head) rows at a time, forward and backward:
    each row's products are its own (per head on contiguous operands, as above), so chunks
    give the written-out chain's bits, and backward takes autograd's own steps in autograd's
    order. The probabilities of attention across a grid's columns are the largest tensors a
    deterministic step would otherwise make and hold (torch's fused attention, the fast
    path, keeps none)."""

    @staticmethod
    def forward(ctx, q, k, v, scale, chunk_bytes):  # type: ignore[override]
        ctx.save_for_backward(q, k, v)
        ctx.scale, ctx.chunk_bytes = scale, chunk_bytes
        out = torch.empty_like(q)
        for rows in _chunks(q, chunk_bytes):
            out[rows] = torch.matmul(_probabilities(q[rows], k[rows], scale), v[rows])
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        q, k, v = ctx.saved_tensors
        grad = grad.contiguous()
        grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for rows in _chunks(q, ctx.chunk_bytes):
            g = grad[rows]
            probs = _probabilities(q[rows], k[rows], ctx.scale)
            grad_v[rows] = torch.matmul(probs.mT, g)
            grad_scores = torch._softmax_backward_data(torch.matmul(g, v[rows].mT), probs, -1, probs.dtype)
            del probs
            grad_scores.mul_(ctx.scale)
            grad_q[rows] = torch.matmul(grad_scores, k[rows])
            grad_k[rows] = torch.matmul(q[rows].mT, grad_scores).mT
        return grad_q, grad_k, grad_v, None, None


def _chunks(q: torch.Tensor, chunk_bytes: int):
    """Slices of the leading dimension: runs of rows whose (L, L) scores fit `chunk_bytes` (a
    row being every head of one leading index), at least one row each."""
    length = q.shape[-2]
    per_row = max(1, q[0].numel() // q.shape[-1] * length * q.element_size())
    step = max(1, chunk_bytes // per_row)
    for start in range(0, q.shape[0], step):
        yield slice(start, min(q.shape[0], start + step))


def _probabilities(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.softmax(torch.matmul(q, k.transpose(-1, -2)).mul_(scale), dim=-1)


def recomputed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                         chunk_bytes: int = ATTENTION_CHUNK_BYTES) -> torch.Tensor:
    """softmax(q kᵀ · scale) v over contiguous (N, ..., L, d) q/k/v, bitwise the written-out
    chain and its gradients, holding q, k and v for backward instead of the (..., L, L)
    probabilities, and making those a chunk of N at a time."""
    return _RecomputedAttention.apply(q, k, v, scale, chunk_bytes)
