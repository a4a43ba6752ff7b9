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

No rank outlives its launcher. The agent stops the ranks when the launch fails or gets SIGTERM
or SIGINT, but a launcher killed outright (SIGKILL, the OOM killer) runs no code: its ranks
would finish the run with nobody waiting, then hang holding the run directory's lock. So on
Linux the kernel ends them: the forkserver asks for SIGKILL when the launcher dies, and each
rank for SIGKILL when the forkserver dies (PR_SET_PDEATHSIG). Elsewhere nothing binds them.
A rank's DataLoader workers are its own children, which torch ends when their rank dies.

A rank starts as its launch finds the launching process, not as the forkserver was when it
started: the same environment (plus the variables the agent sets: RANK, WORLD_SIZE, ...),
working directory and stdout/stderr (passed as file descriptors, multiprocessing's own way).
So a program that launches several times from one process (a driver script, a notebook, the
test suite) reuses one forkserver, and each launch's ranks see that launch's settings. The
launch leaves the caller's signal handlers as it found them.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Sequence
from multiprocessing import reduction
from pathlib import Path

# What every rank imports before its first step; the forkserver imports them once. This module
# first: it binds the forkserver to its launcher (`_bind_forkserver`) before the seconds of torch.
# Not credit.cli: a rank started by `python -m credit.cli` re-runs that module as its
# `__mp_main__`, and runpy warns on every rank when it is already imported.
PRELOAD = ("credit.launch", "torch", "torch.distributed.tensor", "torch.distributed.checkpoint",
           "torch._dynamo", "credit.train", "credit.rollout", "credit.diagnostics")
RANK_NAME = "credit-rank-{rank}"  # the process name (/proc/PID/comm, 15 characters at most)
LAUNCHER_ENV = "CREDIT_LAUNCHER_PID"  # set only while the launcher starts its forkserver
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# The process that imported this module: in a rank, the forkserver the rank was forked from.
_IMPORTED_IN = os.getpid()


class LaunchStopped(Exception):
    """The launcher got SIGTERM or SIGINT; the agent has stopped the ranks."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _end_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when `parent`, the process that started it, ends
    (however it ends); end now if it already has. Linux only: elsewhere this does nothing."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError, TypeError):  # no prctl: not Linux
        return
    if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return
    if os.getppid() != parent:  # the parent died before the request: no signal will come
        os._exit(1)


def _bind_forkserver() -> None:
    """In the forkserver `launch` starts (the first module it imports): end with the launcher.
    The variable leaves the environment here, so no rank or later process sees it.

    The forkserver imports, then only forks: everything it allocates is a module that lives as
    long as it, so its garbage collector is off (the collections it would run while importing
    torch cost a fifth of the imports' time). Before each fork it freezes what it holds, and
    the forked process turns its collector on: left young, the inherited objects would be
    walked by the process's first collections (and their pages copied from the forkserver's),
    a 4-rank launch 10% slower."""
    launcher = os.environ.pop(LAUNCHER_ENV, None)
    if launcher is not None:
        _end_with_parent(int(launcher))
        gc.disable()
        os.register_at_fork(before=gc.freeze, after_in_child=gc.enable)


_bind_forkserver()
# The environment this module was imported with: in a rank, the forkserver's. What differs
# from it in a rank is what the agent set for that rank.
_IMPORTED_ENV = dict(os.environ)
_LAUNCH_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
                        if hasattr(signal, name))


class _PassedFd:
    """A file descriptor of the launching process, handed to each rank as it starts: pickled
    (once per rank) while multiprocessing starts that rank, so the descriptor travels with it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return (_same_fd_in_rank, (reduction.DupFd(self.fd),))


def _same_fd_in_rank(passed) -> int:
    return passed.detach()


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


class LaunchContext:
    """What a process forked from the forkserver takes from the process that starts it (a
    launch's ranks from their launcher): environment, working directory, stdout and stderr.
    Made in the starting process and passed to the started one, which calls `apply`."""

    def __init__(self) -> None:
        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.stdout = _PassedFd(1) if _is_open(1) else None
        self.stderr = _PassedFd(2) if _is_open(2) else None

    def apply(self) -> None:
        """In the started process: write where the starter writes; and when forked from the
        forkserver (whose environment `_IMPORTED_ENV` is), take the starter's environment and
        working directory, keeping what the agent set for this rank."""
        if _IMPORTED_IN != os.getpid():
            set_by_agent = {k: v for k, v in os.environ.items() if _IMPORTED_ENV.get(k) != v}
            os.environ.clear()
            os.environ.update(self.environ)
            os.environ.update(set_by_agent)
            threads = os.environ.get("OMP_NUM_THREADS", "")
            if threads.isdigit() and int(threads) >= 1 and threads != _IMPORTED_ENV.get("OMP_NUM_THREADS"):
                import torch  # preloaded: its thread count was read when the forkserver imported it

                torch.set_num_threads(int(threads))
            os.chdir(self.cwd)
        sys.stdout.flush()
        sys.stderr.flush()
        for passed, target in ((self.stdout, 1), (self.stderr, 2)):
            if isinstance(passed, int) and passed != target:
                os.dup2(passed, target)
                os.close(passed)


def _name_process(rank: str) -> None:
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write(RANK_NAME.format(rank=rank)[:15])
    except OSError:  # not Linux: the name is only a convenience
        pass


def _rank(main: Callable[[list[str]], int], args: list[str], codes: str, context: LaunchContext) -> None:
    """One rank: `main(args)`'s exit code goes to `codes`/RANK.code and is the process's."""
    if _IMPORTED_IN != os.getpid():  # forked from the forkserver, which preloaded this module
        _end_with_parent(_IMPORTED_IN)
    context.apply()
    # ^C reaches every rank of the terminal's process group: end at once, as on SIGTERM (the
    # launcher says why), not through a KeyboardInterrupt whose clean-up could wait on peers
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # The rank's own processes (DataLoader workers) start as its children, as a torchrun rank's
    # do. multiprocessing would start them the way the rank was started: from a forkserver of
    # the rank's own, which nothing ends when the rank dies, and whose workers torch's
    # watchdog (it watches a worker's parent) would never end either.
    multiprocessing.set_start_method("spawn" if sys.platform == "darwin" else "fork", force=True)
    rank = os.environ.get("RANK", "0")
    _name_process(rank)
    code = main(args)
    Path(codes, f"{rank}.code").write_text(str(code))
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def start_forkserver() -> None:
    """Start the forkserver now, from this thread, bound to this process (`_bind_forkserver`),
    so its imports (seconds) run while this process composes and checks the config and imports
    the agent. PR_SET_PDEATHSIG follows the thread that started a process, so the binding holds
    while this thread lives: the one that calls `launch` and waits in it for the ranks. Ranks
    see the environment as it is at their launch (`LaunchContext`). (A forkserver already
    running, started here earlier or by other code, is used as it is.)"""
    from multiprocessing import forkserver

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before the forkserver imports torch
    multiprocessing.set_forkserver_preload(list(PRELOAD))
    os.environ[LAUNCHER_ENV] = str(os.getpid())
    # The forkserver's first import path is the folder it starts in (it runs `python -c`, and
    # Python 3.11's forkserver does not take this process's path): started in a folder holding
    # a `credit` directory (a checkout, a copy) it would import that one. Started from the
    # folder this package was imported from, it imports this one, as this process does.
    here = os.getcwd()
    os.chdir(Path(__file__).resolve().parents[1])
    try:
        forkserver.ensure_running()
    finally:
        os.chdir(here)
        os.environ.pop(LAUNCHER_ENV, None)


def launch(nproc: int, main: Callable[[list[str]], int], args: Sequence[str],
           debug: bool = False) -> tuple[bool, list[int]]:
    """Run `main(args)` (`credit.cli.main`, or a `functools.partial` of a module-level
    function: it reaches each rank pickled, a function by name) on `nproc` local ranks and wait for them. Returns whether the
    agent saw every rank succeed, and the exit codes the ranks recorded (one per rank that
    got as far as recording it). Raises LaunchStopped when SIGTERM or SIGINT stopped the
    launch (the ranks stopped first)."""
    start_forkserver()  # a no-op when the command started it already
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                          start_method="forkserver")
    if not debug:
        logging.disable(logging.ERROR)  # each failing rank prints its own one `error:` line
    # the agent installs its own handlers (to stop the ranks) and leaves them behind
    handlers = ({s: signal.getsignal(s) for s in _LAUNCH_SIGNALS}
                if threading.current_thread() is threading.main_thread() else {})
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryDirectory() as codes:
        try:
            elastic_launch(config, _rank)(main, list(args), codes, LaunchContext())
            succeeded = True
        except ChildFailedError as error:
            if debug:
                print(error, file=sys.stderr)  # the agent's report of each failed rank
            succeeded = False
        except SignalException as stop:  # the agent sent the signal on to the ranks and waited
            raise LaunchStopped(stop.sigval) from None
        finally:
            logging.disable(logging.NOTSET)
            for signum, handler in handlers.items():
                if handler is not None:
                    signal.signal(signum, handler)
        return succeeded, [int(p.read_text()) for p in sorted(Path(codes).glob("*.code"))]
