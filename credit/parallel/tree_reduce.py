"""FSDP2 gradient reduce-scatter that adds ranks in a fixed binary tree (deterministic mode).

FSDP2's default reduce-scatter lets the backend choose the order in which the ranks'
gradients are added (a ring on gloo and NCCL), so the sum over data-parallel ranks is not
the one-process reduction. Here every rank receives each rank's chunk of its own shard
(one all-to-all), and adds them with the GEMM's tree in rank order: dp rank r holds the r-th
contiguous block of the global batch, so its gradient is a subtree of the one-process row
tree and the rank-order tree completes it. tp peers in a flattened dp×tp group hold
identical gradients: their pairwise sums double exactly, and dividing by the number of
copies (a power of two) undoes that exactly. No averaging over dp: deterministic mode
scales the loss by the global batch, so the gradients only need adding.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter  # torch 2.13: not re-exported

from credit.kernels.gemm._tree import tree_sum


class TreeReduceScatter(ReduceScatter):
    def __init__(self, copies: int) -> None:
        self.copies = copies  # identical gradients per dp rank (tp peers in a dp×tp group)

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op: object = None, async_op: bool = False) -> None:
        world = dist.get_world_size(group)
        chunks = input_tensor.view(world, -1)
        received = torch.empty_like(chunks)
        dist.all_to_all_single(received, chunks, group=group)  # row r: rank r's chunk of my shard
        total = tree_sum(list(received.unbind(0)))
        if self.copies > 1:
            total = total / self.copies
        output_tensor.copy_(total.view_as(output_tensor))
        return None


def tree_all_reduce_gradients(params: list[torch.Tensor], dp_group: dist.ProcessGroup) -> int:
    """Deterministic mode's data=ddp: every replica's gradients (tp-local shards included)
    summed over `dp_group` in the rank-order tree, the same bits on every replica, in place.
    replicate()'s all-reduce cannot take a custom reduction (torch 2.13), so deterministic
    ddp keeps parameters unwrapped over dp and adds the replicas here, after backward; one
    all-gather of the flattened gradients. Returns the number of gradients summed."""
    from torch.distributed.tensor import DTensor

    if dist.get_world_size(dp_group) == 1:
        return 0
    local = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
             for p in params if p.grad is not None]
    if not local:
        return 0
    flat = torch.cat([g.reshape(-1) for g in local])
    parts = [torch.empty_like(flat) for _ in range(dist.get_world_size(dp_group))]
    dist.all_gather(parts, flat, group=dp_group)
    total = tree_sum(parts)
    offset = 0
    for grad in local:
        grad.copy_(total[offset: offset + grad.numel()].view_as(grad))
        offset += grad.numel()
    return len(local)
