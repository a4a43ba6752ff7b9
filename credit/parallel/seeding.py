"""Two-stage seeding for tensor- and data-parallel runs.

Stage 1 (`seed_for_init`): the same seed on every rank before the model is built.
fully_shard does not broadcast rank 0's weights, so every rank must construct identical
full weights itself; the global model is then the same whatever the (dp, tp) layout.

Stage 2 (`seed_for_step`): before every optimizer step, the global generators are reseeded
from (seed, dp rank, step). Dropout and other runtime noise then differ between
data-parallel replicas (which see different samples), agree between tensor-parallel peers
(which compute one model together), and depend on nothing else: not on when a job
started or stopped, whether it validated, or what a DataLoader drew from the global
generator in between. A resumed run therefore needs no saved RNG state to continue the
same trajectory bitwise.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_for_init(seed: int) -> None:
    seed_everything(seed)


def step_seed(seed: int, dp_rank: int, step: int) -> int:
    """A 64-bit seed that is a function of (seed, dp_rank, step) alone, well mixed by
    numpy's SeedSequence so neighbouring steps or ranks give unrelated streams."""
    words = np.random.SeedSequence([seed, dp_rank, step]).generate_state(2, np.uint32)
    return int(words[0]) << 32 | int(words[1])


def seed_for_step(seed: int, dp_rank: int, step: int) -> None:
    """Reseed torch's CPU and CUDA generators for optimizer step `step` (0-based) on
    data-parallel rank `dp_rank`; every draw of that step comes from this stream."""
    torch.manual_seed(step_seed(seed, dp_rank, step))
