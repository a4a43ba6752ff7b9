"""Logging for every process of a run: rank 0 speaks, other ranks only warn, prefixed."""

from __future__ import annotations

import logging
import sys


def configure_logging(rank: int = 0, level: int = logging.INFO) -> None:
    """Rank 0 logs at `level`; other ranks log warnings and errors as `rank N: ...`."""
    prefix = "" if rank == 0 else f"rank {rank}: "
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"{prefix}%(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level if rank == 0 else logging.WARNING)
    # advisory notes (e.g. a 2-D norm reduced in two steps) repeated by every rank
    for noisy in ("torch.distributed.checkpoint", "torch.distributed.tensor._redistribute"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
