"""Killing one rank of a running `credit train --nproc N` launch, without a race.

`credit train --nproc N` starts torchrun's agent, which starts the ranks, so the rank to kill
is found by the RANK in its environment, never by its place in the process tree (killing the
agent instead would orphan ranks that go on to finish the run). The watcher polls the run's
metrics and kills when it sees a given step; on a loaded machine the ranks could reach their
next checkpoint between the poll and the kill, so the whole process tree is frozen (SIGSTOP)
first, the rank is killed, and the rest continue.
"""

from __future__ import annotations

import os
import signal


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    for child in children(pid):
        out += [child, *descendants(child)]
    return out


def rank_of(pid: int) -> int | None:
    """The torch.distributed RANK a process was started with, or None."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    for entry in entries:
        if entry.startswith(b"RANK="):
            return int(entry[5:])
    return None


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_last_rank(agent_pid: int) -> int:
    """SIGKILL the highest-numbered rank under `agent_pid` while every process of the launch
    is frozen; returns the rank killed. Raises if no rank is found (the test would be void)."""
    tree = descendants(agent_pid)
    _signal_all(tree, signal.SIGSTOP)
    try:
        ranks = {rank: pid for pid in tree if (rank := rank_of(pid)) is not None}
        if not ranks:
            raise RuntimeError(f"no process under pid {agent_pid} has a RANK in its environment")
        last = max(ranks)
        os.kill(ranks[last], signal.SIGKILL)
        return last
    finally:
        _signal_all(tree, signal.SIGCONT)
