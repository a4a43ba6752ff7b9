"""Run a function on N real ranks (spawned processes, gloo, CPU) and collect what each returns.

Every multi-rank test uses this one helper. The function runs after the process group is
up; whatever it returns (picklable) comes back in rank order. A rank that raises fails
the launch with that rank's traceback.

The ranks are forked from multiprocessing's forkserver, which imports torch and this package
once per test process (`credit.launch.PRELOAD`, as `credit train --nproc` does), instead of
each rank importing them afresh.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import pickle
import signal
import socket
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from credit.launch import PRELOAD


class RankFailure(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world_size: int, port: int, out_dir: str, timeout: float, fn: Callable, args: tuple) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    out = Path(out_dir)
    # on a timeout the parent asks every rank for its Python stacks: where a hang waits
    stacks = open(out / f"{rank}.stacks", "w")  # noqa: SIM115 (open for the process's life)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    # a file rendezvous in this launch's own folder: no port picked here can be taken by a
    # concurrent test between the pick and rank 0's bind (MASTER_PORT stays for code that
    # joins a group again from the environment); a collective stuck for most of the launch's
    # time raises in the ranks, naming the operation, before the parent gives up
    dist.init_process_group("gloo", init_method=f"file://{out / 'rendezvous'}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=max(60.0, timeout - 60.0)))
    try:
        result = fn(*args)
        (out / f"{rank}.pkl").write_bytes(pickle.dumps(result))
        if dist.is_initialized():
            dist.barrier()  # no rank tears gloo down while a peer still talks to it
    except BaseException:
        (out / f"{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    (out / f"{rank}.done").write_text("")  # the work and the teardown of the group finished


def _stacks(context, out_dir: str) -> str:
    """Every live rank's Python stacks (faulthandler, on SIGUSR1), then the ranks killed."""
    alive = [p for p in context.processes if p.is_alive()]
    for process in alive:
        os.kill(process.pid, signal.SIGUSR1)
    time.sleep(2)
    for process in context.processes:
        process.kill()
    parts = []
    for path in sorted(Path(out_dir).glob("*.stacks")):
        done = (Path(out_dir) / f"{path.stem}.done").is_file()
        parts.append(f"--- rank {path.stem}{' (finished)' if done else ''} ---\n{path.read_text()}")
    return "\n".join(parts)


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 300) -> list[Any]:
    """`fn(*args)` on `world_size` ranks; returns the list of per-rank results."""
    multiprocessing.set_forkserver_preload(list(PRELOAD))  # read when the server first starts
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(
            _entry,
            args=(world_size, _free_port(), out_dir, timeout, fn, args),
            nprocs=world_size,
            join=False,
            start_method="forkserver",
        )
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    raise RankFailure(f"ranks did not finish within {timeout} s\n{_stacks(context, out_dir)}")
        except RankFailure:
            raise
        except Exception as error:
            if all((Path(out_dir) / f"{r}.done").is_file() for r in range(world_size)):
                # every rank returned its result and destroyed its process group; one died
                # after that, in interpreter exit (gloo's threads: "terminate called without an
                # active exception"), which is not what a test examines
                warnings.warn(f"a rank failed after finishing its work and its teardown: {error}")
                return [pickle.loads((Path(out_dir) / f"{r}.pkl").read_bytes()) for r in range(world_size)]
            errors = sorted(Path(out_dir).glob("*.err"))
            detail = "\n".join(f"--- rank {p.stem} ---\n{p.read_text()}" for p in errors)
            raise RankFailure(f"{error}\n{detail}") from None
        return [pickle.loads((Path(out_dir) / f"{r}.pkl").read_bytes()) for r in range(world_size)]
