"""Sequence parallelism through `credit train`, fast mode: CREDIT's wxformer earth-padded
to 32x32 runs whole on rows at dp2 x tp2 (FSDP2: the convolution blocks' partial gradients
summed over tp by the reduce-scatter's divide factor, the norms' by the trainer's tp sync),
and gives one process's per-step losses within the 1e-5 relative of docs/parallelism.md; its checkpoint
resumes at dp2 without tensor or sequence parallelism."""

import os

from tiny import tiny_data_overrides
from launches import credit_command
from manual_scripts import run_script

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
CROSSFORMER = ["model=wxformer", "model.padding_conf.activate=true", "model.padding_conf.mode=earth",
               "model.padding_conf.pad_lat=[8,8]", "model.padding_conf.pad_lon=[0,0]"]


def _train(nproc: int, *overrides: str) -> str:
    result = credit_command("train", "--nproc", nproc, *overrides, env=ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def test_whole_model_on_rows_trains_like_one_process(tiny_data, tmp_path):
    base = tiny_data_overrides(tiny_data, *CROSSFORMER, "trainer.max_steps=4", "data.valid_samples=4",
                               "trainer.optimizer.lr=2e-4")  # a calm run: chaotic losses would amplify rounding
    _train(1, *base, "trainer.batch_size=4", f"run_dir={tmp_path / 'serial'}")
    log = _train(4, *base, "parallelism=fsdp2_tp2", "trainer.parallelism.sequence_parallel=true",
                 "trainer.batch_size=2", f"run_dir={tmp_path / 'sp'}")
    assert "4 of 4 stages shard their rows; the whole model runs on rows" in log, log[-2000:]
    check = run_script("check_parity", tmp_path / "serial", tmp_path / "sp", "--rtol", "1e-5")
    assert check.stdout.startswith("PASS: 4 steps match"), check.stdout
    # the same parameters as without sequence parallelism: the final checkpoint resumes at dp2,
    # tp1 (dp2 x tp2 resharding to dp4 is tests/parallel/test_distributed_training.py's)
    resumed = _train(2, *base, "parallelism=fsdp2", "trainer.max_steps=5", "trainer.batch_size=2",
                     f"run_dir={tmp_path / 'sp'}")
    assert "resumed from" in resumed and "step_00000004" in resumed, resumed[-2000:]
