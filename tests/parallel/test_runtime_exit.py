"""`build_runtime` freezes what the process holds out of the garbage collector's full
collections (credit/parallel/runtime.py) and unfreezes it at exit: a process that ran it ends
as any other, without triton's bindings reporting their objects as leaked on its stderr."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import gc
import torch._dynamo  # imports triton, whose bindings list what is still alive at exit
from credit.config import compose_config
from credit.parallel.runtime import build_runtime
build_runtime(compose_config(["trainer.device=cpu"]))
print("frozen:", gc.get_freeze_count() > 0)
"""


def test_a_process_that_built_its_runtime_exits_without_leak_reports():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "frozen: True"
    assert "leaked" not in done.stderr, done.stderr[-2000:]
