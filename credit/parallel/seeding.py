"""Two-stage seeding for tensor- and data-parallel runs.

Stage 1 (`seed_for_init`): the same seed on every rank before the model is built.
fully_shard does not broadcast rank 0's weights, so every rank must construct identical
full weights itself; the global model is then the same whatever the (dp, tp) layout.
Stage 2 (`seed_for_runtime`): `seed + dp_rank` after wrapping, so dropout and other
runtime noise differ between data-parallel replicas (which see different samples) and
agree between tensor-parallel peers (which compute one model together).
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


def seed_for_runtime(seed: int, dp_rank: int) -> None:
    seed_everything(seed + dp_rank)
