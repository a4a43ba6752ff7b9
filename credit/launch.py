"""`--nproc N`: run a command as N local ranks under torch's elastic agent, from one
pre-imported interpreter.

torchrun starts every rank as a fresh interpreter, and each spends seconds importing torch,
torch.distributed.tensor, DCP and this package before its first step. Here the agent runs in
the launching process and starts its ranks with multiprocessing's forkserver: one server
process imports those modules once and forks each rank from itself, so a rank starts with
them loaded. The server never touches a GPU, so a rank may (a process forked after CUDA is
initialised could not).

A rank runs the same command (`credit.cli.main`), sees the same RANK / WORLD_SIZE /
MASTER_ADDR environment torchrun gives, names itself `credit-rank-N` (what `ps` and `top`
show, and how a test finds rank N) and leaves its exit code in a folder, so the launch exits
with the ranks' own code (the agent only knows that a rank failed).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

# What every rank imports before its first step; the forkserver imports them once.
PRELOAD = ("torch", "torch.distributed.tensor", "torch.distributed.checkpoint", "torch._dynamo",
           "credit.cli", "credit.train", "credit.rollout", "credit.diagnostics")
RANK_NAME = "credit-rank-{rank}"  # the process name (/proc/PID/comm, 15 characters at most)


def _name_process(rank: str) -> None:
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write(RANK_NAME.format(rank=rank)[:15])
    except OSError:  # not Linux: the name is only a convenience
        pass


def _rank(args: list[str], codes: str) -> None:
    """One rank: the command's exit code goes to `codes`/RANK.code and is the process's."""
    from credit.cli import main

    rank = os.environ.get("RANK", "0")
    _name_process(rank)
    code = main(args)
    Path(codes, f"{rank}.code").write_text(str(code))
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def launch(nproc: int, args: Sequence[str], debug: bool = False) -> tuple[bool, list[int]]:
    """Run `credit <args>` on `nproc` local ranks and wait for them. Returns whether the
    agent saw every rank succeed, and the exit codes the ranks recorded (one per rank that
    got as far as recording it)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before the forkserver imports torch
    multiprocessing.set_forkserver_preload(list(PRELOAD))
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                          start_method="forkserver")
    if not debug:
        logging.disable(logging.ERROR)  # each failing rank prints its own one `error:` line
    with tempfile.TemporaryDirectory() as codes:
        try:
            elastic_launch(config, _rank)(list(args), codes)
            succeeded = True
        except ChildFailedError as error:
            if debug:
                print(error, file=sys.stderr)  # the agent's report of each failed rank
            succeeded = False
        finally:
            logging.disable(logging.NOTSET)
        return succeeded, [int(p.read_text()) for p in sorted(Path(codes).glob("*.code"))]
