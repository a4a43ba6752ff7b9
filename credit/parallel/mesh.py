"""Process groups and the named (dp, tp) DeviceMesh.

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
    """How `world_size` ranks split into data-parallel replicas of tensor-parallel groups."""

    world_size: int
    dp: int
    tp: int
    data: str


def resolve_layout(world_size: int, data: str, tensor: int) -> ParallelLayout:
    """dp = world_size / tensor; raise ConfigError naming the key when that cannot work.

    `data` and `tensor` are validated values (`credit.config.validate`: a known mode,
    tensor >= 1). This is the one home of the rules that depend on the world size: the CLI
    calls it before launching ranks, and every rank once in `build_runtime`, before any
    process-group work."""
    if world_size % tensor:
        raise ConfigError(
            f"trainer.parallelism.tensor={tensor} does not divide the world size {world_size} "
            f"(dp = world_size / tensor must be whole)"
        )
    dp = world_size // tensor
    if data == "none" and dp > 1:
        raise ConfigError(
            f"trainer.parallelism.data='none' with world size {world_size} and tensor={tensor} "
            f"leaves {dp} data-parallel replicas unsynchronised; use data=ddp or fsdp2, or "
            f"tensor={world_size}"
        )
    return ParallelLayout(world_size=world_size, dp=dp, tp=tensor, data=data)


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
    """A 2-D mesh with named dims ("dp", "tp"); use `mesh["dp"]`, `mesh["tp"]`, never positions.

    A flattened "dp_tp" dimension is registered too, so DTensor reduces a value that is
    partial over both dims (e.g. a gradient norm) in one collective instead of two.
    """
    mesh = init_device_mesh(device_type, (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))
    all_ranks_mesh(mesh)
    return mesh


def all_ranks_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The 1-D "dp_tp" mesh over every rank of the (dp, tp) mesh (created once, then reused)."""
    return mesh[("dp", "tp")]._flatten(mesh_dim_name="dp_tp")
