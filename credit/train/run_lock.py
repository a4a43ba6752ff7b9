"""One training job per run directory: a lock rank 0 holds for the job's life.

A POSIX record lock (`fcntl.lockf`) on `<run_dir>/.credit.lock`: the kernel drops it when the
holding process exits, however it ends, so a crashed or killed run never leaves it stuck,
and it works on NFS and on Lustre/GPFS mounted with locking. The file names its holder (pid,
host, start time, command) for the line a refused job prints. Only rank 0 of a job takes it;
its verdict is broadcast, so every rank of a refused job stops with the same line before
anything is written. (A POSIX lock belongs to the process: the holder must not open and
close the file elsewhere, which would release it; nothing else here opens it.)
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch.distributed as dist

LOCK_NAME = ".credit.lock"


class RunDirInUse(FileExistsError):
    """Another live job holds the run directory."""


def _holder(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 4096).decode(errors="replace").strip()
    return text or "another process (it has not written its name yet)"


def acquire(run_dir: Path) -> int:
    """Create `run_dir` if needed and lock it; return the lock's file descriptor.
    Raises RunDirInUse naming the holder, or NotADirectoryError when run_dir is a file."""
    if run_dir.exists() and not run_dir.is_dir():
        raise NotADirectoryError(f"run_dir {run_dir} is a file; give a directory (new or of an earlier run)")
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _holder(fd)
        os.close(fd)
        raise RunDirInUse(f"run_dir {run_dir} is in use by {holder}; wait for that job to end or "
                          f"choose another run_dir") from None
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
    command = " ".join(sys.argv[:3])
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} (started {started}: {command})\n".encode())
    return fd


@contextmanager
def run_dir_lock(run_dir: str | Path, is_main: bool):
    """Hold the run directory for the block (rank 0 locks; every rank learns the verdict)."""
    fd, problem = None, None
    if is_main:
        try:
            fd = acquire(Path(run_dir))
        except (RunDirInUse, NotADirectoryError) as error:
            problem = error
    if dist.is_available() and dist.is_initialized():
        verdict = [None if problem is None else (type(problem).__name__, str(problem))]
        dist.broadcast_object_list(verdict, src=0)
        if verdict[0] is not None and problem is None:
            kind, message = verdict[0]
            problem = NotADirectoryError(message) if kind == "NotADirectoryError" else RunDirInUse(message)
    if problem is not None:
        raise problem
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock; the file stays (it names the last holder)
