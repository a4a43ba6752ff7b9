"""The triton backend, run by Triton's interpreter on CPU tensors.

All checks run in one subprocess (TRITON_INTERPRET must be set before triton
is imported and must not leak into the rest of the suite); each check is
reported as its own test here.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the triton backend needs the triton package")

HERE = Path(__file__).parent
WORKER = HERE / "triton_interpret_worker.py"
sys.path.insert(0, str(HERE))
from triton_interpret_worker import CHECKS  # noqa: E402  (importing only defines the checks)


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, TRITON_INTERPRET="1")
    repo = str(HERE.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, str(WORKER)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(CHECKS))
def test_triton_interpreted(results, name):
    assert results.get(name) == "ok", results.get(name, "check did not run")
