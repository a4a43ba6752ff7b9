"""Killing one rank of a running `credit train --nproc N` launch, without a race.

`credit train --nproc N` runs the elastic agent, whose forkserver forks the ranks, so the rank
to kill is found by its process name (`credit-rank-N`, `credit.launch`), never by its place
in the process tree (killing the agent or the forkserver instead would orphan ranks that go
on to finish the run). The watcher polls the run's
metrics and kills when it sees a given step; on a loaded machine the ranks could reach their
next checkpoint between the poll and the kill, so the whole process tree is frozen (SIGSTOP)
first, the rank is killed, and the rest continue.
"""

from __future__ import annotations

import os
import signal

from credit.launch import RANK_NAME


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
    """The rank a launched process names itself (`credit-rank-N`), or None."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    prefix = RANK_NAME.format(rank="")
    return int(name[len(prefix):]) if name.startswith(prefix) and name[len(prefix):].isdigit() else None


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
            raise RuntimeError(f"no process under pid {agent_pid} is named {RANK_NAME.format(rank='N')}")
        last = max(ranks)
        os.kill(ranks[last], signal.SIGKILL)
        return last
    finally:
        _signal_all(tree, signal.SIGCONT)
