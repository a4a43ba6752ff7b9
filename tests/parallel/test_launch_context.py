"""`credit.launch.launch` called more than once from one process: one forkserver serves every
launch, and each launch's ranks take that launch's environment, working directory and output,
not the process's as it was when the forkserver started; the caller's signal handlers stay.
A rank collects its garbage (the forkserver, which only imports and forks, does not)."""

from __future__ import annotations

import gc
import os
import signal
from multiprocessing import forkserver

from launches import environment, output_to

from credit.launch import launch


def report(args: list[str]) -> int:
    """A rank's main: what it sees, on its stdout and its stderr, each line in one write so the two
    ranks' lines cannot interleave (`print` writes the text and its newline separately when
    Python runs unbuffered)."""
    os.write(1, f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} sees {os.environ.get('LAUNCH_MARK')} "
                f"in {os.getcwd()} with {args[0]}, collecting garbage: {gc.isenabled()}\n".encode())
    os.write(2, f"rank {os.environ['RANK']} to stderr\n".encode())
    return 0


def test_each_launch_gives_its_ranks_its_environment_folder_and_output(tmp_path):
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    forkservers = set()
    for mark in ("first", "second"):
        folder = tmp_path / mark
        folder.mkdir()
        out, err = folder / "out.txt", folder / "err.txt"
        fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND) for p in (out, err)]
        here = os.getcwd()
        try:
            os.chdir(folder)
            with environment({**os.environ, "LAUNCH_MARK": mark}), output_to(*fds):
                succeeded, codes = launch(2, report, [f"args-{mark}"])
        finally:
            os.chdir(here)
            for fd in fds:
                os.close(fd)
        assert succeeded and codes == [0, 0]
        lines = sorted(out.read_text().splitlines())
        assert lines == [f"rank {r} of 2 sees {mark} in {folder} with args-{mark}, collecting garbage: True"
                         for r in (0, 1)], lines
        assert sorted(err.read_text().splitlines()) == ["rank 0 to stderr", "rank 1 to stderr"]
        forkservers.add(forkserver._forkserver._forkserver_pid)
    assert len(forkservers) == 1  # started by the first launch, reused by the second
    assert "LAUNCH_MARK" not in os.environ
    assert {s: signal.getsignal(s) for s in handlers} == handlers


def test_the_forkserver_imports_this_package_from_any_folder(tmp_path):
    """Started in a folder holding a `credit` directory of its own (a checkout, a test's
    temporary copy), the forkserver still imports the package its launcher runs from."""
    import subprocess
    import sys
    from pathlib import Path

    import credit

    package = Path(credit.__file__).resolve().parent
    (tmp_path / "credit").symlink_to(package)  # the same files under another path
    script = ("import multiprocessing, os, sys\n"
              "from credit.launch import start_forkserver\n"
              "os.chdir(sys.argv[1])\n"
              "start_forkserver()\n"
              "p = multiprocessing.get_context('forkserver').Process(\n"
              "    target=exec, args=('import credit; print(credit.__path__[0], flush=True)',))\n"
              "p.start(); p.join(); sys.exit(p.exitcode)\n")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                            timeout=300, cwd=package.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == str(package), result.stdout
