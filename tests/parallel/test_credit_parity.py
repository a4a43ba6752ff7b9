"""CREDIT's wxformer trains the same in one process and on dp2 x tp2 (FSDP2 over
tensor-parallel groups) with everything on: spectral norm on the tp shards, earth padding,
activation checkpointing, EMA and the SDC checks. Per-step losses within 1e-5 relative
(float32 reassociation in the row-parallel reductions), judged by
manual_tests/gen2_parallelism/check_parity.py."""

import os

from tiny import tiny_data_overrides
from launches import credit_command
from manual_scripts import run_script

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
CROSSFORMER = ["model=wxformer", "model.dim=[16,32,64,128]", "model.dim_head=8",
               "model.local_window_size=[2,2,2,1]", "model.global_window_size=[2,2,1,1]",
               "model.use_spectral_norm=true", "model.padding_conf.activate=true",
               "model.padding_conf.pad_lat=[8,8]", "model.padding_conf.pad_lon=[0,0]"]


def test_crossformer_tp1_and_dp2_tp2_losses_match(tiny_data, tmp_path):
    base = [*CROSSFORMER, *tiny_data_overrides(tiny_data, "trainer.max_steps=6", "data.valid_samples=4"),
            "trainer.ema.enabled=true", "trainer.parallelism.activation_checkpointing=true",
            "diagnostics.sdc.enabled=true", "diagnostics.sdc.every_n_steps=3"]
    serial = credit_command("train", *base, "trainer.batch_size=4", "diagnostics.sdc.checks=[compute]",
                            f"run_dir={tmp_path / 'serial'}", env=ENV)
    assert serial.returncode == 0, serial.stdout[-3000:] + serial.stderr[-3000:]
    sharded = credit_command("train", "--nproc", "4", *base, "parallelism=fsdp2_tp2",
                             "trainer.batch_size=2", f"run_dir={tmp_path / 'tp2'}", env=ENV)
    assert sharded.returncode == 0, sharded.stdout[-3000:] + sharded.stderr[-3000:]
    assert "dp 2 x tp 2" in sharded.stdout
    assert "applied tensor parallel (tp=2) to 16 blocks" in sharded.stdout + sharded.stderr
    assert "applied activation checkpointing" in sharded.stdout + sharded.stderr
    assert "sdc" in (sharded.stdout + sharded.stderr).lower()
    result = run_script("check_parity", tmp_path / "serial", tmp_path / "tp2", "--rtol", "1e-5")
    assert result.returncode == 0, result.stdout
    assert result.stdout.startswith("PASS: 6 steps match")
    assert run_script("check_parity", tmp_path / "serial", tmp_path / "tp2", "--exact").returncode == 1
