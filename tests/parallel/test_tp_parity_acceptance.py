"""tp-parity acceptance: one process (tp1) vs torchrun tp2 (dp2 x tp2) from the same seed and
global batch, and a tp2 resume, judged by manual_tests/gen2_parallelism/check_parity.py."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import tiny_overrides
from launches import credit_command
from manual_scripts import run_script

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _run(args, **kwargs):
    result = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=600, **kwargs)
    return result


def _credit_train(nproc, *overrides):
    result = credit_command("train", "--nproc", nproc, *overrides, env=ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _check(a, b, *flags):
    return run_script("check_parity", a, b, *flags)


@pytest.fixture(scope="module")
def parity_runs(tiny_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    base = tiny_overrides(tiny_data, "trainer.max_steps=6", "trainer.batch_size=2",
                          "trainer.checkpoint.every_n_steps=3", "data.valid_samples=4")
    # tp1: one process with the same global batch (2 dp ranks x 2 samples)
    _credit_train(1, *base, "trainer.batch_size=4", f"run_dir={root / 'serial'}")
    # resume=never on every rank: the decision must not race rank 0's first writes
    tp2 = _credit_train(4, *base, "parallelism=fsdp2_tp2", "trainer.resume=never",
                        f"run_dir={root / 'tp2'}")
    # a second job: tp2's run as its first 3-step job left it (the step-3 checkpoint, the
    # metrics rows after it dropped on resume), resumed through the hydra script under an
    # external torchrun, as a PBS script runs it. A first job stopping at steps_per_job is
    # tests/parallel/test_distributed_training.py's (the same Trainer.fit).
    resumed = root / "tp2_resumed"
    shutil.copytree(root / "tp2", resumed, ignore=shutil.ignore_patterns("step_00000006", ".credit.lock"))
    job = _run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node=4", str(REPO / "applications" / "train.py"), *base,
                "parallelism=fsdp2_tp2", "trainer.steps_per_job=3", f"run_dir={resumed}"],
               cwd=root)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "resumed from" in job.stdout + job.stderr, job.stderr[-3000:]
    return {"root": root, "tp2": tp2}


def test_tp1_and_tp2_losses_match_within_the_readme_tolerance(parity_runs):
    """docs/training.md: the default experiment in one process (tp1) and on dp2 x tp2 gives the same
    per-step losses within 1e-5 relative (float32 reassociation in the reductions)."""
    root = parity_runs["root"]
    result = _check(root / "serial", root / "tp2", "--rtol", "1e-5")
    assert result.returncode == 0, result.stdout
    assert result.stdout.startswith("PASS: 6 steps match")
    assert "dp 2 x tp 2" in parity_runs["tp2"].stdout
    # CPU: gloo; a CUDA run joins "cpu:gloo,cuda:nccl" (tests/parallel/test_collective_devices.py)
    assert "process groups: gloo" in parity_runs["tp2"].stdout
    assert _check(root / "serial", root / "tp2", "--exact").returncode == 1  # not trivially equal


def test_tp2_resume_continues_the_same_losses(parity_runs):
    root = parity_runs["root"]
    result = _check(root / "tp2", root / "tp2_resumed", "--exact")
    assert result.returncode == 0, result.stdout


def test_only_rank_zero_writes_one_run_directory(parity_runs):
    for run in ("tp2", "tp2_resumed", "serial"):
        names = sorted(p.name for p in (parity_runs["root"] / run).iterdir())
        # .credit.lock: rank 0's run-directory lock (credit/train/run_lock.py)
        assert names == [".credit.lock", "checkpoints", "config.yaml", "loss.png", "metrics.csv"], names
    assert not (parity_runs["root"] / "outputs").exists()  # no hydra timestamp directories


def _fake_run(path: Path, losses, max_steps, last_checkpoint):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"trainer:\n  max_steps: {max_steps}\n")
    rows = ["step,epoch,split,loss"] + [f"{i + 1},0,train,{v!r}" for i, v in enumerate(losses)]
    (path / "metrics.csv").write_text("\n".join(rows) + "\n")
    if last_checkpoint:
        ckpt = path / "checkpoints" / f"step_{last_checkpoint:08d}"
        ckpt.mkdir(parents=True)
        (ckpt / ".metadata").write_bytes(b"x")


def test_check_parity_fails_on_every_kind_of_mismatch(tmp_path):
    base = [0.5, 0.4, 0.3]
    _fake_run(tmp_path / "a", base, 3, 3)
    _fake_run(tmp_path / "close", [0.5, 0.4 * (1 + 1e-7), 0.3], 3, 3)
    _fake_run(tmp_path / "far", [0.5, 0.41, 0.3], 3, 3)
    _fake_run(tmp_path / "short", base[:2], 3, 2)
    _fake_run(tmp_path / "unfinished", base, 3, 2)
    _fake_run(tmp_path / "fewer", base[:2], 2, 2)
    assert _check(tmp_path / "a", tmp_path / "close").returncode == 0
    exact = _check(tmp_path / "a", tmp_path / "close", "--exact")
    assert exact.returncode == 1 and "first difference at step 2" in exact.stdout
    far = _check(tmp_path / "a", tmp_path / "far")
    assert far.returncode == 1 and "step 2" in far.stdout
    assert "did not finish" in _check(tmp_path / "a", tmp_path / "short").stdout
    assert "did not finish" in _check(tmp_path / "a", tmp_path / "unfinished").stdout
    fewer = _check(tmp_path / "a", tmp_path / "fewer")
    assert fewer.returncode == 1 and "logged 3 steps" in fewer.stdout
