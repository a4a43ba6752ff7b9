"""Killing one rank of a running `credit train --nproc N` launch, without a race, and finding
every process of a launch.

`credit train --nproc N` runs the elastic agent, whose forkserver forks the ranks, so the rank
to kill is found by its process name (`credit-rank-N`, `credit.launch`), never by its place
in the process tree (killing the agent or the forkserver instead would end every rank). The
watcher polls the run's metrics and kills when it sees a given step; on a loaded machine the
ranks could reach their next checkpoint between the poll and the kill, so the whole process
tree is frozen (SIGSTOP) first, the rank is killed, and the rest continue.

The processes of one launch (launcher, forkserver, ranks, multiprocessing's resource tracker)
all inherit the launcher's environment, so a marker set there finds them wherever they are
in the process tree, and never a concurrent test's launch (`launch_processes`).
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


def launch_processes(marker: str) -> dict[int, tuple[str, int]]:
    """Every live process whose environment holds `marker` ("NAME=VALUE", given to a launcher
    and inherited by all it starts): pid -> (process name, parent pid). A zombie (dead, not
    yet reaped) shows an empty environment and is not counted."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker.encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:  # "pid (name) state ppid ...": name may hold spaces
                name, rest = f.read().rsplit(")", 1)
            found[int(entry)] = (name.split("(", 1)[1], int(rest.split()[1]))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # ended meanwhile, or not ours to read
    return found
