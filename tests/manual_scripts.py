"""The manual tests' comparison scripts (`check_parity.py`, `compare_runs.py`) run in this
process through their own `main(argv)`: the same code and the same output as on the command
line, without a fresh interpreter and torch import per comparison."""

from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path
from subprocess import CompletedProcess
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = {"check_parity": REPO / "manual_tests" / "gen2_parallelism" / "check_parity.py",
           "compare_runs": REPO / "manual_tests" / "determinism" / "compare_runs.py"}
_loaded: dict[str, ModuleType] = {}


def _module(name: str) -> ModuleType:
    if name not in _loaded:
        spec = importlib.util.spec_from_file_location(f"manual_{name}", SCRIPTS[name])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _loaded[name] = module
    return _loaded[name]


def run_script(name: str, *args: object) -> CompletedProcess:
    """`python SCRIPT ARGS...` as a CompletedProcess (returncode, stdout, stderr)."""
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = _module(name).main(argv)
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code if isinstance(exit_.code, int) else 2
    return CompletedProcess([str(SCRIPTS[name]), *argv], code, out.getvalue(), err.getvalue())
