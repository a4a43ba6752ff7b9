"""`trainer.loss.learnable_variance` (CREDIT's BaseLoss `var_weighting: learnable`) in real
runs: the log-variances take their own AdamW step at the constant learning rate, are
checkpointed with their moments (a resumed run keeps the straight run's bits), two
data-parallel ranks learn what one process learns at the same global batch, and in
deterministic mode they do so bitwise."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from launches import credit_command
from tiny import tiny_overrides

from credit.checkpoint.manager import CheckpointManager, checkpoint_keys
from credit.config import ConfigError, compose_config
from credit.data.from_config import build_dataset
from credit.data.latitude import latitude_weights
from credit.data.target_statistics import channel_variance
from credit.train import run_training
from credit.train.losses import training_loss
from credit.train.metrics import read_metrics
from credit.train.validation import output_channel_variables

LEARNED = ["trainer.loss.combine=variables", "trainer.loss.learnable_variance=true", "trainer.loss.space=physical",
           "trainer.optimizer.lr=1e-2", "trainer.max_steps=4", "trainer.checkpoint.every_n_steps=2",
           "trainer.valid_every_n_steps=2", "data.valid_samples=2"]


def _rows(run_dir) -> list[dict[str, str]]:
    """The training rows, then the validation rows, without the columns that measure the machine."""
    rows = [*read_metrics(run_dir / "metrics.csv", "train"), *read_metrics(run_dir / "metrics.csv", "valid")]
    return [{k: v for k, v in row.items() if k not in ("samples_per_s", "peak_mem_mib", "peak_reserved_mib")}
            for row in rows]


def _log_variance(row: dict[str, str], variables: list[str]) -> np.ndarray:
    return np.array([float(row[f"log_variance_{v}"]) for v in variables])


@pytest.fixture(scope="module")
def straight(tiny_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("learned") / "straight"
    run_training(compose_config(tiny_overrides(tiny_data, *LEARNED, f"run_dir={run}")))
    return run


def test_they_step_at_the_constant_rate_and_resume_bitwise(tiny_data, straight, tmp_path):
    cfg = compose_config(tiny_overrides(tiny_data, *LEARNED, f"run_dir={straight}"))
    train = build_dataset(cfg.data, "train_period")
    v = cfg.data.variables
    channels = output_channel_variables(v.upper_air, train.levels, v.surface, v.diagnostic)
    variables = list(dict.fromkeys(channels))
    variance = channel_variance(train.target_std)
    start = np.array([math.log(max(variance[[i for i, c in enumerate(channels) if c == name]].mean(), 1e-12))
                      for name in variables])
    normalized = compose_config(tiny_overrides(tiny_data, *LEARNED, "trainer.loss.space=normalized", "run_dir=x"))
    scored = training_loss(normalized.trainer.loss, channels, latitude_weights(train.latitude), train.target_std,
                           train.target_mean)
    assert scored.learned.log_variance.detach().tolist() == [0.0] * len(variables)  # normalized values: variance 1
    rows = _rows(straight)
    # AdamW's first step moves each by lr (|m / sqrt(v)| = 1) after the decay, while the model's
    # rate is still warming up: theirs is the constant trainer.optimizer.lr, as CREDIT's trainer has it
    lr, decay = cfg.trainer.optimizer.lr, cfg.trainer.optimizer.weight_decay
    assert float(rows[0]["lr"]) < lr
    moved = np.abs(_log_variance(rows[0], variables) - start.astype(np.float32) * (1 - lr * decay))
    np.testing.assert_allclose(moved, lr, rtol=1e-3)
    assert [r["split"] for r in rows] == ["train"] * 4 + ["valid"] * 2
    assert not np.array_equal(_log_variance(rows[3], variables), _log_variance(rows[1], variables))
    checkpoint = CheckpointManager(straight / "checkpoints", 2).complete_checkpoints()[-1][1]
    assert {"loss.log_variance", "loss.exp_avg", "loss.exp_avg_sq", "loss.step"} <= checkpoint_keys(checkpoint)

    resumed = tmp_path / "resumed"
    for job in range(2):
        run_training(compose_config(tiny_overrides(tiny_data, *LEARNED, f"run_dir={resumed}",
                                                   "trainer.steps_per_job=2")))
    assert _rows(resumed) == rows  # raw strings: losses, norms, log-variances and validation bitwise


def test_two_data_parallel_ranks_learn_what_one_process_learns(tiny_data, straight, tmp_path):
    run = tmp_path / "dp2"
    result = credit_command("train", "--nproc", 2, *tiny_overrides(
        tiny_data, *LEARNED, "trainer.parallelism.data=fsdp2", "trainer.batch_size=2", f"run_dir={run}"),
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ours, one = _rows(run), _rows(straight)  # one process: batch 4; here 2 ranks x 2
    assert [r["step"] for r in ours] == [r["step"] for r in one]
    variables = [c.removeprefix("log_variance_") for c in ours[0] if c.startswith("log_variance_")]
    for mine, theirs in zip(ours, one):
        assert float(mine["loss"]) == pytest.approx(float(theirs["loss"]), rel=1e-4)
        if mine["split"] == "train":
            np.testing.assert_allclose(_log_variance(mine, variables), _log_variance(theirs, variables), atol=1e-5)


def test_deterministic_mode_gives_one_process_bits_at_dp2(tiny_data, tmp_path):
    """Losses, norms, log-variances and validation bitwise, one process against two ranks."""
    runs = {}
    for ranks in (1, 2):
        run = runs[ranks] = tmp_path / f"ranks{ranks}"
        result = credit_command("train", "--nproc", ranks, *tiny_overrides(
            tiny_data, *LEARNED, "model.gemm=deterministic", "trainer.parallelism.data=fsdp2",
            f"trainer.batch_size={4 // ranks}", f"run_dir={run}"), env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    one, two = _rows(runs[1]), _rows(runs[2])
    assert [r["split"] for r in one] == ["train"] * 4 + ["valid"] * 2 and one == two
    assert one[0]["log_variance_T"] != one[3]["log_variance_T"]


@pytest.mark.parametrize("extra, message", [
    (["trainer.loss.combine=channels"], "needs trainer.loss.combine=variables"),
    (["trainer.loss.inverse_variance=true"], "or trainer.loss.inverse_variance, not both"),
])
def test_what_it_cannot_go_with_is_one_line(tiny_data, tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        compose_config(tiny_overrides(tiny_data, *LEARNED, f"run_dir={tmp_path}", *extra))
