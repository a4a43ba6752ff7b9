"""Where a training process runs: its device and its place among the ranks."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch
from torch.distributed.device_mesh import DeviceMesh

from credit.parallel.mesh import ParallelLayout


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    rank: int = 0
    world_size: int = 1
    dp_rank: int = 0
    dp_size: int = 1
    tp_size: int = 1
    layout: ParallelLayout | None = None
    mesh: DeviceMesh | None = None  # named ("dp", "tp"); None in a single process

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


def rng_state() -> dict[str, object]:
    state: dict[str, object] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, object]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
