"""Process groups and the named (dp, tp) DeviceMesh, or (dp, ens, tp) when a sample's ensemble
members are spread over ranks (`trainer.parallelism.ensemble` > 1).

Layout arithmetic is checked before any process-group work, so a bad
`trainer.parallelism` fails fast with one line naming the key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from credit.config.validate import ConfigError


@dataclass(frozen=True)
class ParallelLayout:
    """How `world_size` ranks split into data-parallel replicas (different samples) of
    ensemble groups (a sample's members split `ens` ways) of tensor-parallel groups."""

    world_size: int
    dp: int
    tp: int
    data: str
    ens: int = 1


def resolve_layout(world_size: int, data: str, tensor: int, ensemble: int = 1) -> ParallelLayout:
    """dp = world_size / (ensemble x tensor); raise ConfigError naming the key when that cannot work.

    `data`, `tensor` and `ensemble` are validated values (`credit.config.validate`: a known
    mode, degrees >= 1). This is the one home of the rules that depend on the world size: the
    CLI calls it before launching ranks, and every rank once in `build_runtime`, before any
    process-group work."""
    if world_size % (tensor * ensemble):
        key, value = (("trainer.parallelism.tensor", tensor) if ensemble == 1 else
                      ("trainer.parallelism.ensemble", f"{ensemble} (x tensor={tensor})"))
        raise ConfigError(
            f"{key}={value} does not divide the world size {world_size} "
            f"(dp = world_size / (ensemble x tensor) must be whole)"
        )
    dp = world_size // (tensor * ensemble)
    if data == "none" and dp > 1:
        raise ConfigError(
            f"trainer.parallelism.data='none' with world size {world_size} and tensor={tensor} "
            f"leaves {dp} data-parallel replicas unsynchronised; use data=ddp or fsdp2, or "
            f"tensor={world_size}"
        )
    return ParallelLayout(world_size=world_size, dp=dp, tp=tensor, data=data, ens=ensemble)


def launched_world_size() -> int:
    """World size announced by the launcher (torchrun, mpiexec), 1 when run directly."""
    for key in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        if key in os.environ:
            return int(os.environ[key])
    return 1


def _adopt_mpi_environment() -> None:
    """mpiexec names ranks differently from torchrun; torch.distributed reads RANK etc."""
    pairs = (
        ("RANK", ("OMPI_COMM_WORLD_RANK", "PMI_RANK")),
        ("WORLD_SIZE", ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")),
        ("LOCAL_RANK", ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PALS_LOCAL_RANKID")),
    )
    for target, sources in pairs:
        if target not in os.environ:
            for source in sources:
                if source in os.environ:
                    os.environ[target] = os.environ[source]
                    break
    if "RANK" in os.environ and "MASTER_ADDR" not in os.environ:
        raise RuntimeError(
            "launched under MPI without MASTER_ADDR/MASTER_PORT: export them (e.g. the first "
            "host of the job and a free port) before mpiexec"
        )


def process_group_backend(device: torch.device) -> str:
    """The process-group backend for a run on `device`.

    On CUDA every group is device-aware ("cpu:gloo,cuda:nccl"): CUDA tensors go through
    NCCL, host tensors (object collectives, barriers, small host-side counters) through
    gloo. A bare "nccl" group rejects a CPU tensor on the first collective that gets one.
    Mesh sub-groups inherit the pair from the default group.
    """
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def init_distributed(device: torch.device) -> tuple[int, int]:
    """Join the launcher's process group (`process_group_backend`); return (rank, world)."""
    if launched_world_size() == 1:
        return 0, 1
    _adopt_mpi_environment()
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        # no device_id: an eagerly bound NCCL communicator makes DeviceMesh split its
        # sub-groups NCCL-only, and they would lose the gloo half
        dist.init_process_group(backend=process_group_backend(device))
    return dist.get_rank(), dist.get_world_size()


def build_device_mesh(layout: ParallelLayout, device_type: str) -> DeviceMesh:
    """A mesh with named dims ("dp", "tp"), or ("dp", "ens", "tp") when `layout.ens` > 1; use
    `mesh["dp"]`, `mesh["tp"]`, `replica_mesh(mesh)`, never positions.

    Flattened dimensions are registered too: every rank ("dp_tp", or "dp_ens_tp"), so DTensor
    reduces a value that is partial over all of them (e.g. a gradient norm) in one
    collective instead of two or three, and with ens the replicas ("dp_ens").
    """
    if layout.ens == 1:
        mesh = init_device_mesh(device_type, (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))
    else:
        mesh = init_device_mesh(device_type, (layout.dp, layout.ens, layout.tp), mesh_dim_names=("dp", "ens", "tp"))
        replica_mesh(mesh)
    all_ranks_mesh(mesh)
    return mesh


def has_ensemble_axis(mesh: DeviceMesh) -> bool:
    return "ens" in (mesh.mesh_dim_names or ())


def replica_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The ranks a tensor-parallel shard of the model is replicated over, whose gradients
    add up to the step's: `mesh["dp"]`, or dp x ens flattened ("dp_ens", dp-major: a
    sample's member blocks are neighbours in its rank order) when members are spread."""
    if not has_ensemble_axis(mesh):
        return mesh["dp"]
    return mesh[("dp", "ens")]._flatten(mesh_dim_name="dp_ens")


ALL_RANKS_DIMS = ("dp_tp", "dp_ens_tp")
"""The names of the flattened every-rank dimension, without and with an ensemble axis."""


def all_ranks_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The 1-D mesh over every rank (created once, then reused): "dp_tp", or "dp_ens_tp"."""
    if not has_ensemble_axis(mesh):
        return mesh[("dp", "tp")]._flatten(mesh_dim_name="dp_tp")
    return mesh[("dp", "ens", "tp")]._flatten(mesh_dim_name="dp_ens_tp")
