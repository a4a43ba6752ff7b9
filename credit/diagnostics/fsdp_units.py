"""The FSDP2 units of a parallelised model: their parameters in gather and reduce order.

FSDP2 has no public view of a unit's parameter layout (which parameters it gathers, in
which order they sit in the reduce-scatter buffer, over which process group), so this module
reads it from FSDP2's per-module state, in this one place, and fails with one clear line if
a torch release moves it. Nothing here changes FSDP2's state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from credit.compat import fsdp_gather_dtype, fsdp_param_groups


@dataclass
class UnitParam:
    name: str  # fully qualified, as in model.named_parameters()
    module: nn.Module  # owner; getattr(module, attr) is the gathered tensor inside forward
    attr: str
    sharded: torch.Tensor  # this rank's shard (a DTensor), what the all-gather sends
    shard_numel: int  # its padded length in the reduce-scatter output
    gather_dtype: torch.dtype | None  # what FSDP2 casts the shard to before gathering (None: none)


@dataclass
class FSDPUnit:
    name: str  # module path of the unit's (first) module; "<root>" for the model itself
    modules: tuple[nn.Module, ...]
    params: list[UnitParam]
    group: dist.ProcessGroup  # the shard group the unit gathers over and reduces into
    group_ranks: tuple[int, ...]  # its global ranks, in shard order
    param_group: object  # FSDP2's FSDPParamGroup (its reduce-scatter comm is wrapped)


def _param_group(module: FSDPModule):
    try:
        groups = fsdp_param_groups(module._get_fsdp_state())
        return groups[0] if len(groups) == 1 else None
    except AttributeError as error:  # a torch release reorganised FSDP2's state
        raise RuntimeError(f"diagnostics.sdc cannot read FSDP2's unit layout in torch "
                           f"{torch.__version__}: {error}") from error


def fsdp_units(model: nn.Module) -> list[FSDPUnit]:
    """Every FSDP2 unit with sharded parameters, in module order (one per param group)."""
    names = {id(m): n for n, m in model.named_modules()}
    units: list[FSDPUnit] = []
    seen: set[int] = set()
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = _param_group(module)
        if group is None or id(group) in seen:
            continue
        shard_group = getattr(group.mesh_info, "shard_process_group", None)
        if shard_group is None:  # replicate() (data=ddp): nothing gathered or scattered
            continue
        seen.add(id(group))
        params = []
        for fsdp_param in group.fsdp_params:
            info = fsdp_param._module_info
            owner = names[id(info.module)]
            params.append(UnitParam(
                name=f"{owner}.{info.param_name}" if owner else info.param_name,
                module=info.module, attr=info.param_name, sharded=fsdp_param.sharded_param,
                shard_numel=fsdp_param.padded_sharded_param_size.numel(),
                gather_dtype=fsdp_gather_dtype(group, fsdp_param)))
        units.append(FSDPUnit(
            name=names[id(group.modules[0])] or "<root>", modules=tuple(group.modules),
            params=params, group=shard_group,
            group_ranks=tuple(dist.get_process_group_ranks(shard_group)), param_group=group))
    return units
