"""Logging for every process of a run: rank 0 speaks, other ranks only warn, prefixed."""

from __future__ import annotations

import logging
import sys


class _StdoutHandler(logging.StreamHandler):
    """A handler on whatever `sys.stdout` is when a record is written, not when the handler
    was made: a caller that swaps stdout (a notebook, a test's capture) and closes the old
    one leaves no handler writing to a closed file."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure_logging(rank: int = 0, level: int = logging.INFO) -> None:
    """Rank 0 logs at `level`; other ranks log warnings and errors as `rank N: ...`."""
    prefix = "" if rank == 0 else f"rank {rank}: "
    handler = _StdoutHandler()
    handler.setFormatter(logging.Formatter(f"{prefix}%(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level if rank == 0 else logging.WARNING)
    # advisory notes (e.g. a 2-D norm reduced in two steps) repeated by every rank
    for noisy in ("torch.distributed.checkpoint", "torch.distributed.tensor._redistribute"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
