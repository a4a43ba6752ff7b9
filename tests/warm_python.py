"""A `python` whose every run forks from one process that has imported torch and this package.

The GPU kit's dry run (tests/manual/test_gpu_kit.py) runs manual_tests/gpu/run.sh, which
starts about thirty interpreters, each importing torch and this package (about 5 s of CPU on
a 2-core VM) before a step of a second or two. Given `PYTHON=<folder>/python`, each of them
is instead a small client that hands its arguments, environment, working directory and
standard streams to a server started once per test, which forks a child to run them: the
same code on the same files, without the imports. The child is also what the script's own
`sys.executable` children run, so a benchmark's workers fork from the server too.

Hand-written because nothing in the standard library forks a preloaded interpreter on
behalf of a command line; multiprocessing's forkserver takes only its own Process objects.

The forms the kit uses are served: `python SCRIPT ARGS`, `python -m MODULE ARGS`,
`python -c CODE ARGS` and `python - ARGS` (the program on standard input). A client killed
(the kit's `timeout`) takes its run's whole process group with it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

CLIENT = "client"
SERVE = "serve"


# ------------------------------------------------------------------ client (stdlib only: runs under -S)
def _client(socket_path: str, argv: list[str]) -> int:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(socket_path)
    socket.send_fds(conn, [b"F"], [0, 1, 2])
    header = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    conn.sendall(struct.pack("!I", len(header)) + header)
    status = b""
    while len(status) < 4:
        chunk = conn.recv(4 - len(status))
        if not chunk:
            return 1  # the server went away
        status += chunk
    return struct.unpack("!i", status)[0]


# ------------------------------------------------------------------ server
def _receive(conn: socket.socket) -> tuple[list[int], dict]:
    _, fds, _, _ = socket.recv_fds(conn, 1, 3)
    size = b""
    while len(size) < 4:
        size += conn.recv(4 - len(size))
    (length,) = struct.unpack("!I", size)
    body = b""
    while len(body) < length:
        body += conn.recv(length - len(body))
    return fds, json.loads(body)


def _run_program(argv: list[str]) -> int:
    """What `python ARGV` runs, in this (forked) process; returns the exit code."""
    import runpy

    import types

    main = types.ModuleType("__main__")
    try:
        if argv and argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv and argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path.insert(0, "")
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        elif argv and argv[0] == "-":
            sys.argv = ["-", *argv[1:]]
            sys.path.insert(0, "")
            sys.modules["__main__"] = main
            exec(compile(sys.stdin.read(), "<stdin>", "exec"), main.__dict__)
        elif argv and not argv[0].startswith("-"):
            sys.argv = list(argv)
            sys.path.insert(0, str(Path(argv[0]).resolve().parent))
            runpy.run_path(argv[0], run_name="__main__")
        else:
            print(f"warm_python: unsupported arguments {argv!r}", file=sys.stderr)
            return 2
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or 0
        print(exit_.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 (what an interpreter does with an uncaught exception)
        import traceback

        traceback.print_exc()
        return 1
    return 0


def _child(fds: list[int], request: dict, executable: str) -> None:
    os.setpgid(0, 0)  # the client's death ends this run and whatever it started
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", closefd=False, buffering=1)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) >= 1:
        import torch

        torch.set_num_threads(int(threads))
    sys.executable = executable  # the program's own `sys.executable` children come here too
    sys.path[:] = _BASE_PATH  # an interpreter's path, without this file's folder
    code = 1
    try:
        code = _run_program(request["argv"])
    finally:
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code if 0 <= code <= 255 else 1)


def _handle(conn: socket.socket, executable: str) -> None:
    """A forked handler: start the run, wait for it or for the client's end, report its exit."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    fds, request = _receive(conn)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _child(fds, request, executable)
    for fd in fds:
        os.close(fd)
    import select

    pidfd = os.pidfd_open(pid)
    ready, _, _ = select.select([conn, pidfd], [], [])
    if pidfd not in ready:  # the client is gone (killed): so is its run
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            if select.select([pidfd], [], [], grace)[0]:
                break
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    code = 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
    try:
        conn.sendall(struct.pack("!i", code))
    except OSError:
        pass
    os._exit(0)


_BASE_PATH: list[str] = []


def _serve(socket_path: str, executable: str) -> None:
    import importlib

    _BASE_PATH[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

    from credit.launch import PRELOAD

    for name in PRELOAD:
        importlib.import_module(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            _handle(conn, executable)
        conn.close()


class WarmPython:
    """The server, running while this object does: `executable` is the `python` to hand out."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.socket_path = str(folder / "warm_python.sock")
        self.executable = str(folder / "python")
        Path(self.executable).write_text(
            "#!/bin/sh\n"
            f'exec "{sys.executable}" -S -E "{Path(__file__).resolve()}" {CLIENT} "{self.socket_path}" "$@"\n')
        os.chmod(self.executable, 0o755)
        self._server = subprocess.Popen([sys.executable, __file__, SERVE, self.socket_path, self.executable],
                                        stdout=subprocess.PIPE, text=True, start_new_session=True)
        if self._server.stdout.readline().strip() != "ready":
            raise RuntimeError(f"warm_python: the server did not start (exit {self._server.wait()})")

    def stop(self) -> None:
        try:
            os.killpg(self._server.pid, signal.SIGKILL)  # the server and any run still going
        except ProcessLookupError:
            pass
        self._server.wait()
        self._server.stdout.close()

    def __enter__(self) -> WarmPython:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    if sys.argv[1] == CLIENT:
        sys.exit(_client(sys.argv[2], sys.argv[3:]))
    if sys.argv[1] == SERVE:
        _serve(sys.argv[2], sys.argv[3])
