"""Where a process runs: its device, its place among the ranks, and the named (dp, tp) mesh.

`build_runtime` is the one bring-up shared by training and rollout: it resolves the layout
once (before any process-group work, so a bad `trainer.parallelism` fails in one line),
joins the launcher's process group and builds the mesh.

It also freezes the garbage collector's view of what the process holds by then (`gc.freeze`):
the modules of torch and this package, a few hundred thousand objects that live as long as
the process. Python's full collections would otherwise walk them all again, many times a
step (the dispatch of every DTensor op allocates); on a small model that walk was a tenth of
a rank's CPU time. What the run allocates later is collected as before. They are unfrozen at
exit, so the interpreter's last clean-up frees them as usual (frozen, triton's bindings report
their objects as leaked).
"""

from __future__ import annotations

import atexit
import gc
from dataclasses import dataclass

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch.distributed.device_mesh import DeviceMesh

from credit.parallel.mesh import (
    ParallelLayout,
    build_device_mesh,
    init_distributed,
    launched_world_size,
    resolve_layout,
)


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    rank: int = 0
    dp_rank: int = 0
    dp_size: int = 1
    ens_rank: int = 0  # this rank's block of each sample's members (trainer.parallelism.ensemble)
    ens_size: int = 1
    layout: ParallelLayout | None = None  # None in a single process
    mesh: DeviceMesh | None = None  # named ("dp", "tp") or ("dp", "ens", "tp"); None in a single process

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when present; asking for CUDA without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device='cuda' but no CUDA device is available; use 'cpu' or 'auto'")
    return torch.device(name)


def build_runtime(cfg: DictConfig) -> Runtime:
    """Resolve the layout of `trainer.parallelism` for the launched world size, join the
    process group and build the named mesh; a single process gets no mesh. Freezes the
    objects alive now out of the garbage collector's full collections (module docstring)."""
    gc.freeze()
    atexit.unregister(gc.unfreeze)  # once, however many runs this process makes
    atexit.register(gc.unfreeze)
    device = resolve_device(cfg.trainer.device)
    par = cfg.trainer.parallelism
    layout = resolve_layout(launched_world_size(), par.data, par.tensor, par.ensemble)
    rank, _ = init_distributed(device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    if layout.world_size == 1:
        return Runtime(device=device)
    mesh = build_device_mesh(layout, device.type)
    return Runtime(
        device=device,
        rank=rank,
        dp_rank=mesh["dp"].get_local_rank(),
        dp_size=layout.dp,
        ens_rank=mesh["ens"].get_local_rank() if layout.ens > 1 else 0,
        ens_size=layout.ens,
        layout=layout,
        mesh=mesh,
    )


def launched_rank() -> int:
    """This process's rank as the launcher announced it (0 when run directly)."""
    import os

    for key in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def shutdown() -> None:
    """Leave the process group, when one was joined."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
