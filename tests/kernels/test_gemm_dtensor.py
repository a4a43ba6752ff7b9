"""DetLinear under torch tensor parallelism (2 gloo ranks on CPU, subprocess)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

HERE = Path(__file__).parent
CHECKS = ["tp_matches_unsharded_bias", "tp_matches_unsharded_nobias", "rejects_unsupported",
          "rejects_whole_reductions_that_are_split"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    init_file = tmp_path_factory.mktemp("tp") / "init"
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    repo = str(HERE.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, str(HERE / "dtensor_tp_worker.py"), str(init_file)],
                          capture_output=True, text=True, env=env, timeout=300)
    finished = all(Path(f"{init_file}.done{rank}").is_file() for rank in range(2))
    assert proc.returncode == 0 or finished, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", CHECKS)
def test_tensor_parallel(results, name):
    assert results.get(name) == "ok", results.get(name, "check did not run")
