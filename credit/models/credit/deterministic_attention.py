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
