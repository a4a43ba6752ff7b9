"""Layout-keeping tensor ops run on a DTensor's local shard.

An op that sends each element to the element at the same index of its result (a copy, zeros
of the same shape, a multiply by a scalar) gives, on a DTensor, the DTensor of that op on
every rank's local shard, with the same mesh, placements, shape and stride, and the same bits.
DTensor gets there by propagating the op's sharding, which costs about 10 ms of CPU per rank
the first time it meets each operation, shape and placement: a model's parameters meet it
hundreds of times when their optimizer state, EMA copies and clipped gradients are first made
(seconds of every launch on a CPU). These helpers skip that step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor


def local_values(tensor: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (an alias: in-place ops write the DTensor), else `tensor`."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


@torch.no_grad()
def map_shards(tensor: torch.Tensor, op: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`op(tensor)` for an `op` that keeps each element's index and the tensor's shape and
    stride, outside autograd: on a DTensor, `op` of its local shard, wrapped with the
    DTensor's own layout. A pending sum (`Partial`) keeps DTensor's op, which reduces it first."""
    if not isinstance(tensor, DTensor) or any(p.is_partial() for p in tensor.placements):
        return op(tensor)
    return DTensor.from_local(op(tensor.to_local()), tensor.device_mesh, tensor.placements,
                              run_check=False, shape=tensor.shape, stride=tensor.stride())
