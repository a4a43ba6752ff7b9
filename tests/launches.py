"""`credit ARGS...` as a CompletedProcess (returncode, stdout, stderr), the way tests run it:
a fresh process that has not imported anything, without paying for the imports.

A one-process command runs in a process forked from multiprocessing's forkserver, which
`credit.launch` starts once per test process with torch and this package imported
(`credit.launch.PRELOAD`): its own process, so no global state (seeds, deterministic-algorithm
flags, logging handlers) reaches the test process or another command, with this call's
environment, working directory and output (`credit.launch.LaunchContext`), about 5 s of CPU
sooner than a new interpreter on a 2-core VM. A multi-rank command (`--nproc N`, N > 1) runs
its launcher in this process: the same `credit.cli.main`, agent and forkserver, whose ranks
take this launch's environment, folder and output; that skips the launcher's start-up and the
forkserver's imports, about 10 s of CPU a launch. Tests of the launcher itself (a killed
launcher, a killed rank), and of what a new interpreter prints, start `python -m credit.cli`
as their own process, as a user's shell does.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from subprocess import CompletedProcess

from credit.launch import LaunchContext, start_forkserver


def _ranks(args: list[str]) -> int:
    for i, arg in enumerate(args):
        if arg.startswith("--nproc="):
            return int(arg.split("=", 1)[1])
        if arg == "--nproc" and i + 1 < len(args):
            return int(args[i + 1])
    return 1


@contextlib.contextmanager
def environment(env: Mapping[str, str] | None) -> Iterator[None]:
    saved = dict(os.environ)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def output_to(out: int, err: int) -> Iterator[None]:
    """This process's stdout and stderr (descriptors and Python streams) into `out`, `err`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(out, 1)
    os.dup2(err, 2)
    try:
        with open(1, "w", closefd=False, buffering=1) as text_out, \
                open(2, "w", closefd=False, buffering=1) as text_err, \
                contextlib.redirect_stdout(text_out), contextlib.redirect_stderr(text_err):
            yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def _exit_code(exit_: SystemExit) -> int:
    return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)


def _command_in_fork(argv: list[str], context: LaunchContext) -> None:
    """The forked process: `credit ARGV` with the caller's environment, folder and output, and
    multiprocessing's default start method, as a new interpreter has it (its DataLoader workers
    start as a user's would)."""
    context.apply()
    multiprocessing.set_start_method(None, force=True)
    from credit.cli import main

    try:
        code = main(argv)
    except SystemExit as exit_:
        code = _exit_code(exit_)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def _forked(argv: list[str], timeout: float) -> int:
    start_forkserver()  # a no-op once running
    process = multiprocessing.get_context("forkserver").Process(target=_command_in_fork,
                                                                args=(argv, LaunchContext()))
    process.start()
    process.join(timeout)
    if process.exitcode is None:
        process.kill()
        process.join()
        raise subprocess.TimeoutExpired(["credit", *argv], timeout)
    return process.exitcode


@contextlib.contextmanager
def _working_directory(cwd: str | os.PathLike | None) -> Iterator[None]:
    here = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(here)


def credit_command(*args: object, env: Mapping[str, str] | None = None, timeout: float = 600,
                   cwd: str | os.PathLike | None = None) -> CompletedProcess:
    """Run `credit ARGS...` (in folder `cwd`); returns its exit code and everything it and its
    ranks printed. `timeout` bounds a one-process command; a launch is bounded by the test's own
    timeout."""
    argv = [str(a) for a in args]
    with tempfile.TemporaryDirectory() as folder, _working_directory(cwd):
        # appended to by every writer (launcher, ranks): none overwrites another's lines
        paths = [os.path.join(folder, name) for name in ("stdout", "stderr")]
        fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND) for p in paths]
        try:
            with environment(env), output_to(*fds):
                if _ranks(argv) <= 1:
                    code = _forked(argv, timeout)
                else:
                    from credit.cli import main

                    try:
                        code = main(argv)
                    except SystemExit as exit_:  # the launcher exits with its ranks' code
                        code = _exit_code(exit_)
        finally:
            for fd in fds:
                os.close(fd)
        out, err = (open(p, encoding="utf-8", errors="replace").read() for p in paths)
    return CompletedProcess(["credit", *argv], code, out, err)
