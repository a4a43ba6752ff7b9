"""Bytes each rank sends per step, by process group, counted from the collectives a traced
step calls.

`CommVolume` sees every collective as the operator it dispatches: DTensor's redistributions
and functional collectives (`_c10d_functional`) and plain c10d calls (`c10d`), including
FSDP2's. It counts the operators DTensor's comm-debug mode (`CommDebugMode`) counts, by
operator alone: that mode also attributes collectives to modules, and its module tracker
fails when a step calls the model more than once (multi-step forecasts, gradient
accumulation). For each collective it adds the payload: the bytes one rank sends when the
collective runs as a ring, the usual measure of communication volume (NCCL's bus bandwidth
counts the same):

- all-gather: (n - 1) x the rank's input;
- reduce-scatter, all-to-all: (n - 1) / n x the rank's input;
- all-reduce: 2 (n - 1) / n x the tensor (a reduce-scatter, then an all-gather);
- broadcast: the tensor.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_GATHER = {"all_gather_into_tensor", "all_gather_into_tensor_coalesced", "all_gather_into_tensor_out"}
_REDUCE_SCATTER = {"reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_out",
                   "alltoall_", "alltoall_base_", "all_to_all_single"}
_ALL_REDUCE = {"allreduce_", "allreduce_coalesced_", "all_reduce", "all_reduce_", "all_reduce_coalesced",
               "all_reduce_coalesced_"}
_TO_ONE = {"gather_", "scatter_", "reduce_", "broadcast_", "broadcast"}  # counted as the whole tensor
# c10d's in-place forms take (output, input, ...): a gather's payload is its input, a
# reduce-scatter's its output (the input / n)
_INPUT_SECOND = {"_allgather_base_", "allgather_", "allgather_coalesced_", "allgather_into_tensor_coalesced_"}
_OUTPUT_FIRST = {"_reduce_scatter_base_", "reduce_scatter_", "reduce_scatter_tensor_coalesced_"}


def _bytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor))


def _group_of(args: Sequence[Any]) -> dist.ProcessGroup | None:
    """The group of a c10d call (a ProcessGroup argument) or of a functional collective (its
    last string argument, the group's name)."""
    for value in args:
        if isinstance(value, torch.ScriptObject) and "ProcessGroup" in value._type().qualified_name():
            return dist.ProcessGroup.unbox(value)
    names = [value for value in args if isinstance(value, str)]
    return dist.distributed_c10d._resolve_process_group(names[-1]) if names else None


def ring_bytes(name: str, args: Sequence[Any], ranks: int) -> float:
    """Bytes one rank sends for collective `name` over `ranks` ranks (module docstring)."""
    if ranks <= 1:
        return 0.0
    if name in _INPUT_SECOND:
        return float((ranks - 1) * _bytes(args[1]))
    if name in _OUTPUT_FIRST:
        return float((ranks - 1) * _bytes(args[0]))
    payload = _bytes(args[0])
    if name in _TO_ONE:
        return float(payload)
    if name in _GATHER:
        return float((ranks - 1) * payload)
    if name in _REDUCE_SCATTER:
        return (ranks - 1) / ranks * payload
    return 2 * (ranks - 1) / ranks * payload  # _ALL_REDUCE


_NAMESPACES = {"c10d", "_c10d_functional"}
_COLLECTIVES = _GATHER | _REDUCE_SCATTER | _ALL_REDUCE | _TO_ONE | _INPUT_SECOND | _OUTPUT_FIRST


class CommVolume(TorchDispatchMode):
    """Within the mode, per process group label (`labels`: group name -> e.g. "tp"): how
    many collectives ran (`calls`) and the bytes this rank sent (`sent`, `ring_bytes`)."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        super().__init__()
        self.labels = dict(labels)
        self.sent: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor for t in types):
            return NotImplemented  # DTensor comes back with its collectives and local operators
        out = func(*args, **(kwargs or {}))
        packet = getattr(func, "_overloadpacket", None)
        name = getattr(packet, "__name__", "")
        if getattr(func, "namespace", None) in _NAMESPACES and name in _COLLECTIVES:
            group = _group_of(args)
            ranks = group.size() if group is not None else 1
            label = self.labels.get(group.group_name, f"{ranks} ranks") if group is not None else "?"
            self.calls[label] += 1
            self.sent[label] += ring_bytes(name, args, ranks)
        return out
