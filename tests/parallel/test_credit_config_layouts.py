"""Training from a CREDIT config file (`credit train --credit-config`, CREDIT's gen1 files as
`credit data generate --layout credit-gen1` writes them) in deterministic mode gives the same
bits in one process and on dp2 x tp2: every metric of every step and every tensor of the final checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys

from manual_scripts import run_script

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "credit.cli", *args], capture_output=True, text=True,
                          env=ENV, timeout=600)


def test_deterministic_credit_config_run_is_bitwise_across_layouts(tmp_path):
    data = tmp_path / "data"
    made = _cli("data", "generate", "--layout", "credit-gen1", "--out", str(data), "--grid", "8x16",
                "--years", "2000", "2001", "--levels", "500", "850", "--days-per-year", "3", "--no-progress")
    assert made.returncode == 0, made.stderr
    # spectral norm off: deterministic mode refuses it with dp > 1 (its backward reduces each
    # rank's own gradient before the ranks are summed)
    common = ["--credit-config", str(data / "credit.yml"), "model.gemm=deterministic", "model.use_spectral_norm=false",
              "model.dim=[16,32,64,128]", "model.dim_head=8", "trainer.max_steps=2", "trainer.steps_per_job=0",
              "trainer.progress_bar=false", "trainer.checkpoint.every_n_steps=0"]
    single = _cli("train", *common, "trainer.batch_size=4", f"run_dir={tmp_path / 'single'}")
    assert single.returncode == 0, single.stderr[-3000:]
    sharded = _cli("train", "--nproc", "4", *common, "parallelism=fsdp2_tp2", "trainer.batch_size=2",
                   f"run_dir={tmp_path / 'dp2tp2'}")
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert "dp 2 x tp 2" in sharded.stdout + sharded.stderr
    compared = run_script("compare_runs", tmp_path / "single", tmp_path / "dp2tp2")
    assert compared.returncode == 0, compared.stdout + compared.stderr
