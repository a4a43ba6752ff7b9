"""Killing one rank of a running `credit train --nproc N` launch, without a race.

The watcher polls the run's metrics and kills when it sees a given step. On a loaded machine
the ranks could reach their next checkpoint between the poll and the kill, so the whole
process tree is frozen (SIGSTOP) first, one rank is killed, and the rest continue.
"""

from __future__ import annotations

import os
import signal


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    for child in children(pid):
        out += [child, *descendants(child)]
    return out


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_last_rank(agent_pid: int) -> None:
    """SIGKILL the launcher's last child (a rank) while every process of the launch is frozen."""
    tree = descendants(agent_pid)
    _signal_all(tree, signal.SIGSTOP)
    os.kill(children(agent_pid)[-1], signal.SIGKILL)
    _signal_all(tree, signal.SIGCONT)
