"""`model.gemm=deterministic` through `credit train`: one process vs tensor parallelism.

Same seed and global batch, dropout on: per-step training losses equal bitwise
(check_parity.py --exact) between one process and tp = 2 (one dp rank), and the run trains.
"""

import csv
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECK = [sys.executable, str(REPO / "manual_tests" / "gen2_parallelism" / "check_parity.py")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# two 2-head stages of width 64: 32 per rank at tp=2, a whole GEMM leaf
DETERMINISTIC = ["model.gemm=deterministic", "model.dim=[64,64]", "model.dim_head=32",
                 "model.attn_dropout=0.1", "model.ff_dropout=0.1", "trainer.max_steps=8",
                 "trainer.batch_size=2", "trainer.checkpoint.every_n_steps=0",
                 "trainer.valid_every_n_steps=0", "data.valid_samples=2"]


def _train(overrides, nproc=1):
    result = subprocess.run([sys.executable, "-m", "credit.cli", "train", "--nproc", str(nproc),
                             *overrides], capture_output=True, text=True, env=ENV, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_tensor_parallel_training_is_bitwise_one_process(tiny_overrides, tmp_path):
    _train(tiny_overrides(tmp_path / "serial", *DETERMINISTIC))
    tp = _train(tiny_overrides(tmp_path / "tp2", *DETERMINISTIC, "trainer.parallelism.data=none",
                               "trainer.parallelism.tensor=2"), nproc=2)
    assert "tp=2" in tp.stdout + tp.stderr
    check = subprocess.run([*CHECK, str(tmp_path / "serial"), str(tmp_path / "tp2"), "--exact"],
                           capture_output=True, text=True, env=ENV, timeout=120)
    assert check.returncode == 0, check.stdout
    assert check.stdout.startswith("PASS: 8 steps match exactly")
    with open(tmp_path / "serial" / "metrics.csv") as f:
        losses = [float(r["loss"]) for r in csv.DictReader(f) if r["split"] == "train"]
    assert losses[-1] < losses[0]
