"""Gradient norms, clipping and replica synchronisation across mixed device meshes.

After tensor parallelism and fully_shard, the projections' gradients are DTensors on the
2-D (dp, tp) mesh while every other gradient lives on the 1-D dp mesh (or is a plain
tensor without data parallelism). `torch.nn.utils.clip_grad_norm_` stacks all norms in
one foreach call, which DTensor rejects across meshes; here gradients are grouped by
mesh, each group goes through torch's own `get_total_norm`, and the groups combine; the
clipping factor then scales each gradient's local values.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.nn.utils import get_total_norm

from credit.parallel.mesh import ALL_RANKS_DIMS


def _mesh_key(tensor: torch.Tensor) -> object:
    return tensor.device_mesh if isinstance(tensor, DTensor) else None


def _group_by_mesh(tensors: Iterable[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[object, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(_mesh_key(tensor), []).append(tensor)
    return list(groups.values())


def total_grad_norm(
    grads: Iterable[torch.Tensor], norm_type: float = 2.0, error_if_nonfinite: bool = False
) -> torch.Tensor:
    """The p-norm of all `grads` together, as a plain tensor (global over every mesh).

    Each mesh group's norm comes from `torch.nn.utils.get_total_norm`; a DTensor group's
    norm is made global with `full_tensor()`; group norms combine as (sum n_i^p)^(1/p),
    or their max for p = inf. With a single group of plain tensors this is exactly
    torch's computation.
    """
    norm_type = float(norm_type)
    groups = _group_by_mesh(g for g in grads if g is not None)
    if not groups:
        return torch.tensor(0.0)
    norms = []
    for group in groups:
        norm = get_total_norm(group, norm_type, error_if_nonfinite)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if len(norms) == 1:
        return norms[0]
    stacked = torch.stack([n.to(norms[0].device) for n in norms])
    if norm_type == float("inf"):
        return stacked.max()
    return torch.linalg.vector_norm(stacked, norm_type)


@torch.no_grad()
def clip_grad_norm_(
    parameters: Iterable[torch.Tensor] | torch.Tensor,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    dynamic_scale: float | None = None,
) -> torch.Tensor:
    """Scale gradients so their global norm is at most `max_norm`; return the norm before.

    Bit-identical to `torch.nn.utils.clip_grad_norm_` for plain tensors; also works when
    parameters live on different device meshes, where torch's version raises. With
    `dynamic_scale` s the limit is sqrt(s x the norm) instead (CREDIT's `grad_max_norm: dynamic`).
    """
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    params = [p for p in parameters if p.grad is not None]
    total = total_grad_norm([p.grad for p in params], norm_type, error_if_nonfinite)
    if not params:
        return total
    # torch's clip_grads_with_norm_ factor, applied to each gradient's local values: the same
    # bits as DTensor's elementwise multiply by a replicated scalar, without the sharding
    # propagation of a foreach op over mixed meshes and placements (seconds per new layout)
    if dynamic_scale is not None:
        max_norm = torch.sqrt(dynamic_scale * total)
    factor = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    local = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params]
    for device, grads in _group_by_device(local).items():
        torch._foreach_mul_(grads, factor.to(device))
    return total


def _group_by_device(tensors: list[torch.Tensor]) -> dict[torch.device, list[torch.Tensor]]:
    groups: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(tensor.device, []).append(tensor)
    return groups


def _replicated_over_tp(param: torch.Tensor) -> bool:
    """True when every tp peer holds the same local values of `param`."""
    if not isinstance(param, DTensor):
        return True
    names = param.device_mesh.mesh_dim_names or ()
    if any(name in ALL_RANKS_DIMS for name in names):  # sharded or averaged over all ranks, tp peers included
        return False
    if "tp" not in names:
        return True
    return not isinstance(param.placements[names.index("tp")], Shard)


def sync_replicated_gradients(model: nn.Module, tp_mesh: DeviceMesh) -> int:
    """Average, across the tp group, the gradients of parameters that tp does not shard;
    sum those that are partial sums over a rank's rows (sequence parallelism,
    `model.sequence_partial_gradients`).

    TP peers see the same batch and compute the same replicated gradients, but nothing
    else forces them to stay bitwise equal (e.g. non-deterministic GPU kernels), and
    replicas that drift apart silently become different models. The average is taken
    in float64, so gradients that already agree are returned unchanged to the bit.
    One all-reduce for all of them. Returns the number of gradients synchronised.
    """
    if tp_mesh.size() == 1:
        return 0
    partial = getattr(model, "sequence_partial_gradients", frozenset())
    named = [(name, p.grad) for name, p in model.named_parameters()
             if p.grad is not None and _replicated_over_tp(p)]
    if not named:
        return 0
    local = [g.to_local() if isinstance(g, DTensor) else g for _, g in named]
    flat = torch.cat([t.reshape(-1).to(torch.float64) for t in local])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=tp_mesh.get_group())
    offset = 0
    for (name, _), tensor in zip(named, local):
        n = tensor.numel()
        total = flat[offset : offset + n].view_as(tensor)
        tensor.copy_(total if name in partial else total / tp_mesh.size())
        offset += n
    return len(named)
