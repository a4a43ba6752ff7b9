"""The one place a model is parallelised, in one order:

tensor parallel -> activation checkpointing -> data parallel per block -> data parallel root.

Data parallelism is FSDP2 (`fully_shard`: parameters sharded over `mesh["dp"]`) or DDP
semantics through FSDP2's `replicate` (parameters replicated over `mesh["dp"]`, gradients
all-reduced). With an ensemble axis the replicas are dp x ens (`replica_mesh`): the ranks
of one sample's member blocks hold one model and add their gradients as dp ranks do. Both
keep parameters as DTensors, so they compose with tensor parallelism and save/load through
the same DCP state dicts; classic `DistributedDataParallel` cannot hold DTensor parameters.

The blocks wrapped one by one are named by the model's `_shard_units` (a container's
children, or a single module); the parallelizer knows no class names. A block without
tensor-parallel parameters is identical on every tp peer, so with tp > 1 it is sharded
(or replicated) over all dp x tp ranks (the flattened "dp_tp" mesh) instead of dp alone:
tp peers then hold a quarter, not a half, of its weights at dp2 x tp2, and the gradient
average over dp x tp equals the average over dp because tp peers' gradients are equal.
"""

from __future__ import annotations

import logging
from functools import partial

import torch
from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from credit.parallel.mesh import all_ranks_mesh, has_ensemble_axis, replica_mesh
from credit.parallel.sequence import apply_sequence_parallel, partial_gradient_names
from credit.parallel.tensor_parallel import apply_native_tensor_parallel
from credit.parallel.tree_reduce import TreeReduceScatter

log = logging.getLogger(__name__)

def shard_units(model: nn.Module) -> list[nn.Module]:
    """The blocks named by the model's `_shard_units`, in order: the children of a
    ModuleList/ModuleDict path, or the module at any other path."""
    units: list[nn.Module] = []
    for path in getattr(model, "_shard_units", ()):
        module = model.get_submodule(path)
        if isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            units.extend(module.children())
        else:
            units.append(module)
    return units


def _has_tp_params(module: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in module.parameters())


def _partial_units(model: nn.Module, units: list[nn.Module]) -> list[nn.Module]:
    """The units (sharded over dp x tp) whose gradients are partial sums over a tp rank's
    rows (sequence parallelism on the convolutions); a unit mixing them with whole
    gradients cannot take one reduction and raises."""
    partial = getattr(model, "sequence_partial_gradients", frozenset())
    if not partial:
        return []
    names = {module: name for name, module in model.named_modules()}
    chosen = []
    for unit in units:
        params = [f"{names[unit]}.{n}" for n, _ in unit.named_parameters()]
        flags = {name in partial for name in params}
        if flags == {True, False}:
            raise ValueError(f"{names[unit]} mixes parameters on rows and on whole grids; "
                             f"sequence parallelism cannot reduce its gradients in one step")
        if flags == {True}:
            chosen.append(unit)
    return chosen


def _sum_over_tp(unit: nn.Module, partial_units: list[nn.Module], in_group: int, dp: int) -> None:
    """A unit over dp x tp whose gradients are partial over its tp ranks: its reduction sums
    over tp and averages over dp (FSDP2's divide factor dp, not dp x tp)."""
    if in_group != 1 and in_group != len(partial_units):
        raise ValueError("shard_granularity=grouped with sequence parallelism needs every unit "
                         "without tensor-parallel weights on rows")
    unit.set_gradient_divide_factor(float(dp))
    unit.set_force_sum_reduction_for_comms(True)  # a plain sum, then the division: gloo has no pre-scaled sum


def _data_parallel_wrap(data: str, mixed_precision: str, reshard_after_forward: bool,
                        deterministic: bool, dp_mesh: DeviceMesh):
    """`wrap(module_or_modules, mesh)` applying `data` ("fsdp2" or "ddp") to one unit."""
    policy = MixedPrecisionPolicy()
    if mixed_precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if data != "fsdp2":
        return partial(replicate, mp_policy=policy)
    shard = partial(fully_shard, mp_policy=policy, reshard_after_forward=reshard_after_forward)

    def wrap(module, mesh: DeviceMesh) -> None:
        shard(module, mesh=mesh)
        if deterministic:  # tp peers in a dp x tp unit hold identical gradient copies
            unit = module[0] if isinstance(module, list) else module
            unit.set_custom_reduce_scatter(TreeReduceScatter(mesh.size() // dp_mesh.size()))

    return wrap


def parallelize_model(
    model: nn.Module,
    mesh: DeviceMesh,
    data: str,
    *,
    activation_checkpointing: bool = False,
    mixed_precision: str = "none",
    reshard_after_forward: bool = True,
    shard_granularity: str = "block",
    deterministic: bool = False,
    spectral_norm_tp: str = "shard",
    sequence_parallel: bool = False,
    sequence_regather: bool = True,
) -> nn.Module:
    """Apply TP over `mesh["tp"]`, optional activation checkpointing, then `data` over
    `replica_mesh(mesh)` (`mesh["dp"]`, or dp x ens).

    `data` is "fsdp2", "ddp" or "none"; `mixed_precision="bf16"` (fsdp2/ddp only) computes
    with bf16 parameters and reduces gradients in fp32. With fsdp2, `reshard_after_forward`
    frees each unit's gathered weights after its forward (gathering again for backward),
    and `shard_granularity` chooses the units: "block" (each `_shard_units` block its own
    unit: lowest peak memory, collectives overlap compute) or "grouped" (one unit for the
    tp-sharded blocks and one for the rest: two gathers and two reduce-scatters a step, for
    small models where collective latency dominates). `deterministic` gives every FSDP2
    unit a reduce-scatter that adds ranks in a fixed tree and does not average, and with
    ddp leaves the replicas unwrapped for the trainer's tree all-reduce
    (`credit.parallel.tree_reduce`). `spectral_norm_tp` ("shard" or "replicate",
    `model.spectral_norm_tp`): see `apply_native_tensor_parallel`. `sequence_parallel` (tp > 1)
    splits the rows of the transformer stages over `mesh["tp"]` (`credit.parallel.sequence`),
    before tensor parallelism plans their layers; `sequence_regather` keeps only a rank's rows
    of each gathered block input for backward. All are validated values (`credit.config.validate`
    holds those rules). Returns the model (modified in place).
    """
    tp_mesh, dp_mesh = mesh["tp"], replica_mesh(mesh)
    if tp_mesh.size() > 1:
        regather = sequence_regather and not activation_checkpointing  # checkpointing recomputes it anyway
        stages = apply_sequence_parallel(model, tp_mesh, deterministic, regather) if sequence_parallel else []
        apply_native_tensor_parallel(model, tp_mesh, spectral_norm_tp, stages)
    # gradients that are partial sums over a rank's rows: summed over tp after backward
    model.sequence_partial_gradients = partial_gradient_names(model)

    units = shard_units(model)
    if activation_checkpointing:
        for unit in units:
            checkpoint(unit)
        log.info("applied activation checkpointing to %d blocks", len(units))

    if data == "none":
        return model
    if data == "ddp" and deterministic:
        # replicate()'s all-reduce takes no custom reduction: parameters stay unwrapped
        # replicas and the trainer adds gradients in the rank-order tree after backward.
        log.info("deterministic ddp over dp=%d: gradients summed by the rank-order tree "
                 "(credit.parallel.tree_reduce.tree_all_reduce_gradients)", dp_mesh.size())
        return model
    wrap = _data_parallel_wrap(data, mixed_precision, reshard_after_forward, deterministic, dp_mesh)
    # Blocks without tp parameters are identical on tp peers: shard them over every rank.
    everyone = all_ranks_mesh(mesh) if tp_mesh.size() > 1 else dp_mesh
    with_tp = [unit for unit in units if _has_tp_params(unit)]
    without_tp = [unit for unit in units if not _has_tp_params(unit)]
    sum_over_tp = _partial_units(model, without_tp)
    if shard_granularity == "grouped":
        for group, group_mesh in ((with_tp, dp_mesh), (without_tp, everyone)):
            if group:
                wrap(group, mesh=group_mesh)
                if group is without_tp and sum_over_tp:
                    _sum_over_tp(group[0], sum_over_tp, len(without_tp), dp_mesh.size())
    else:
        for unit in units:
            wrap(unit, mesh=dp_mesh if unit in with_tp else everyone)
            if unit in sum_over_tp:
                _sum_over_tp(unit, sum_over_tp, 1, dp_mesh.size())
    wrap(model, mesh=dp_mesh)
    log.info(
        "applied %s over %s=%d to %d blocks (%d without tp parameters over all %d ranks; "
        "units: %s) and the root (mixed precision: %s)",
        data, "dp x ens" if has_ensemble_axis(mesh) else "dp", dp_mesh.size(), len(units), len(without_tp),
        everyone.size(), shard_granularity, mixed_precision,
    )
    return model
