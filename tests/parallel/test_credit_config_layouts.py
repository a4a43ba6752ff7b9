"""Training from a CREDIT config file (`credit train --credit-config`, CREDIT's gen1 or gen2 files
and config as `credit data generate --layout credit-gen1|credit-gen2` writes them) in
deterministic mode gives the same
bits in one process and on dp2 x tp2: every metric of every step and every tensor of the final
checkpoint (gen2 with the loss of CREDIT's gen2 example: physical units, per-variable means,
inverse-variance weights, a pointwise pre- and postblock). Continuing CREDIT's own run from its checkpoint.pt (weights, AdamW state, step)
gives the same bits in one process and at dp2 x tp2."""

from __future__ import annotations

import os
import subprocess

import pytest

from credit_fixtures import CHECKPOINT_RUN, credit_run_config
from launches import credit_command
from manual_scripts import run_script

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return credit_command(*args, env=ENV)


@pytest.mark.parametrize("layout", ["credit-gen1", "credit-gen2"])
def test_deterministic_credit_config_run_is_bitwise_across_layouts(tmp_path, layout):
    data = tmp_path / "data"
    made = _cli("data", "generate", "--layout", layout, "--out", str(data), "--grid", "8x16",
                "--years", "2000", "2001", "--levels", "500", "850", "--days-per-year", "3", "--no-progress")
    assert made.returncode == 0, made.stderr
    # the generated config's crossformer has spectral norm on, as CREDIT's production configs do
    common = ["--credit-config", str(data / "credit.yml"), "model.gemm=deterministic",
              "model.dim=[16,32,64,128]", "model.dim_head=8", "trainer.max_steps=2", "trainer.steps_per_job=0",
              "trainer.progress_bar=false", "trainer.checkpoint.every_n_steps=0"]
    if layout == "credit-gen2":  # the loss of CREDIT's gen2 example (BaseLoss): physical units, per variable,
        # T through CREDIT's sqrt_transform preblock and square_transform postblock
        common += ["trainer.loss.space=physical", "trainer.loss.combine=variables", "trainer.loss.inverse_variance=true",
                   "data.credit.transforms=[{kind:sqrt,variables:[T]}]",
                   "data.credit.output_inverse=[{kind:square,variables:[T]}]"]
    single = _cli("train", *common, "trainer.batch_size=4", f"run_dir={tmp_path / 'single'}")
    assert single.returncode == 0, single.stderr[-3000:]
    sharded = _cli("train", "--nproc", "4", *common, "parallelism=fsdp2_tp2", "trainer.batch_size=2",
                   f"run_dir={tmp_path / 'dp2tp2'}")
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert "dp 2 x tp 2" in sharded.stdout + sharded.stderr
    # CREDIT's train_batch_size is per rank: the log says which global batch both runs share
    assert "global batch of dp 1 x trainer.batch_size 4 = 4 samples" in single.stdout + single.stderr
    assert "global batch of dp 2 x trainer.batch_size 2 = 4 samples" in sharded.stdout + sharded.stderr
    compared = run_script("compare_runs", tmp_path / "single", tmp_path / "dp2tp2")
    assert compared.returncode == 0, compared.stdout + compared.stderr


def test_continuing_credits_run_is_bitwise_in_one_process_and_at_dp2_tp2(tmp_path):
    # CREDIT's run with two or more attention heads in every stage (fixture `wide/`), so tp=2
    # splits every attention and its AdamW state is placed on FSDP2 x TP shards
    fixture = CHECKPOINT_RUN / "wide"
    single_config = credit_run_config(tmp_path / "single", fixture)
    sharded_config = credit_run_config(tmp_path / "dp2tp2", fixture)
    common = ["model.gemm=deterministic", "trainer.max_steps=3", "trainer.progress_bar=false"]
    single = _cli("train", "--credit-config", str(single_config), *common, "trainer.batch_size=4")
    assert single.returncode == 0, single.stderr[-3000:]
    sharded = _cli("train", "--nproc", "4", "--credit-config", str(sharded_config), *common,
                   "parallelism=fsdp2_tp2", "trainer.batch_size=2")
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert "dp 2 x tp 2" in sharded.stdout + sharded.stderr
    for result in (single, sharded):
        assert "continuing CREDIT's run from" in result.stdout + result.stderr
    compared = run_script("compare_runs", tmp_path / "single" / "run", tmp_path / "dp2tp2" / "run")
    assert compared.returncode == 0, compared.stdout + compared.stderr
