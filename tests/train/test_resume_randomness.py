"""Training randomness is a function of (seed, dp rank, step): resumes are bitwise with
dropout on, whether a job stopped on schedule or was killed, and the sampler continues at
the right sample when the global batch changes."""

import os
import signal
import subprocess
import sys
import time

import torch

from credit.checkpoint.manager import CheckpointManager
from credit.config import compose_config
from credit.parallel import build_runtime
from credit.parallel.seeding import step_seed
from credit.train import run_training
from credit.train.metrics import read_metrics
from credit.train.trainer import Trainer

DROPOUT = ["model.attn_dropout=0.1", "model.ff_dropout=0.1"]


def losses(run_dir):
    return [(int(r["step"]), r["loss"]) for r in read_metrics(run_dir / "metrics.csv")]


def test_step_seed_depends_on_seed_rank_and_step_only():
    assert step_seed(42, 0, 7) == step_seed(42, 0, 7)
    seeds = {step_seed(s, r, k) for s in (1, 2) for r in (0, 1) for k in (0, 1)}
    assert len(seeds) == 8


def test_dropout_on_split_jobs_continue_the_same_trajectory_bitwise(tmp_path, tiny_overrides):
    common = [*DROPOUT, "trainer.max_steps=12", "trainer.checkpoint.every_n_steps=0"]
    straight = tmp_path / "straight"
    run_training(compose_config(tiny_overrides(straight, *common)))
    resumed = tmp_path / "resumed"
    for _ in range(2):  # each job validates at its end, then saves: neither may shift the RNG
        run_training(compose_config(tiny_overrides(resumed, *common, "trainer.steps_per_job=6")))
    assert len(losses(straight)) == 12
    assert losses(resumed) == losses(straight)  # raw strings: bitwise-equal floats


def test_dropout_on_a_killed_run_resumes_bitwise(tmp_path, tiny_overrides):
    """SIGKILL mid-run (between checkpoints), then resume=auto: the same losses and weights."""
    common = [*DROPOUT, "trainer.max_steps=40", "trainer.checkpoint.every_n_steps=4",
              "trainer.valid_every_n_steps=0"]
    straight = tmp_path / "straight"
    run_training(compose_config(tiny_overrides(straight, *common)))

    killed = tmp_path / "killed"
    args = [sys.executable, "-m", "credit.cli", "train", *tiny_overrides(killed, *common)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        metrics = killed / "metrics.csv"
        if metrics.exists() and len(metrics.read_text().splitlines()) > 10:  # header + 10 steps
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    assert process.wait(timeout=60) == -signal.SIGKILL
    stopped_at = CheckpointManager(killed / "checkpoints", 2).complete_checkpoints()[-1][0]
    assert 8 <= stopped_at < 40  # killed mid-run, after at least two checkpoints

    run_training(compose_config(tiny_overrides(killed, *common)))  # trainer.resume=auto
    assert losses(killed) == losses(straight)
    final = [CheckpointManager(run / "checkpoints", 2).latest() for run in (straight, killed)]
    assert final[0].name == final[1].name == "step_00000040"


def test_a_changed_global_batch_resumes_at_the_next_unseen_samples(tmp_path, tiny_overrides):
    """5 steps of 4 samples used samples 0..19 of the epoch order; with 6 per batch the
    epoch continues at batch ceil(20 / 6) = 4, i.e. samples 24..29 of the same order."""
    first = tmp_path / "first"
    run_training(compose_config(tiny_overrides(first, "trainer.max_steps=5")))
    checkpoint = CheckpointManager(first / "checkpoints", 1).latest()
    cfg = compose_config(tiny_overrides(tmp_path / "second", "trainer.batch_size=6",
                                        f"trainer.resume={checkpoint}", "trainer.max_steps=8"))
    trainer = Trainer(cfg, build_runtime(cfg))
    trainer.setup()
    assert (trainer.step, trainer.progress.epoch, trainer.progress.batch_in_epoch) == (5, 0, 4)
    order = trainer.sampler.epoch_order(0)
    _, _, indices = next(trainer.sampler.iterate_forever())
    assert indices == order[24:30]
    trainer.sampler.set_position(0, 4)
    batch = next(iter(trainer.loader))
    expected = torch.stack([trainer.train_set[i]["state"] for i in order[24:30]])
    assert torch.equal(batch["state"], expected)
