"""Bad inputs around a training run: each one clear `error:` line (exit 2), nothing already
written lost. Real processes, real run directories, real DCP checkpoints."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import credit
import credit.train
from launches import credit_command

from credit.cli import main as credit_main
from credit.train.metrics import read_metrics
from credit.train.run_lock import RunDirInUse, acquire
from credit.train.schedule import WarmupCosine

SRC = str(Path(credit.__file__).resolve().parents[1])


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    return credit_command(*args, env=env, timeout=300)


def _one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def _snapshot(run: Path) -> dict[str, str]:
    """Every file under `run` (the lock file aside) and a hash of its bytes."""
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file() and p.name != ".credit.lock"}


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory):
    """A finished 2-step run with a checkpoint at every step."""
    from tiny import tiny_overrides

    run = tmp_path_factory.mktemp("hardening") / "run"
    overrides = tiny_overrides(tiny_data, f"run_dir={run}", "trainer.max_steps=2",
                               "trainer.checkpoint.every_n_steps=1", "trainer.checkpoint.keep_latest_k=3")
    assert credit_main(["train", *overrides]) == 0
    return run, overrides


def test_a_second_job_on_a_live_run_dir_is_refused_naming_the_holder(tiny_overrides, tmp_path):
    run = tmp_path / "run"
    lock = acquire(run)  # this test process plays the live job's rank 0
    try:
        result = _cli("train", *tiny_overrides(run, "trainer.max_steps=2"))
        line = _one_error_line(result.stderr)
        assert result.returncode == 2
        assert f"run_dir {run} is in use by pid {os.getpid()} on " in line
        assert "wait for that job to end or choose another run_dir" in line
        assert _snapshot(run) == {}  # the refused job wrote nothing
    finally:
        os.close(lock)
    # a job that dies holding the lock (killed: no clean-up) leaves nothing stuck
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from credit.train.run_lock import acquire; acquire(Path(sys.argv[1])); "
         "print('locked', flush=True); time.sleep(300)", str(run)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": SRC})
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirInUse, match=f"in use by pid {holder.pid} "):
            acquire(run)
    finally:
        holder.kill()
        holder.wait()
    os.close(acquire(run))  # free again


def test_a_run_dir_that_is_a_file_is_one_line(tiny_overrides, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("my notes\n")
    result = _cli("train", *tiny_overrides(path, "trainer.max_steps=1"))
    assert result.returncode == 2
    assert f"run_dir {path} is a file" in _one_error_line(result.stderr)
    assert "Traceback" not in result.stderr
    assert path.read_text() == "my notes\n"


def test_resuming_with_another_model_names_the_keys_and_changes_nothing(trained, capsys):
    run, overrides = trained
    before = _snapshot(run)
    code = credit_main(["train", *overrides, "trainer.max_steps=3", "model.dim=[16,64]", "model.depth=[1,2]"])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2
    assert f"cannot resume from {run / 'checkpoints' / 'step_00000002'}" in line
    assert "model.depth: run [1, 2], checkpoint [1, 1]; model.dim: run [16, 64], checkpoint [16, 32]" in line
    assert "trainer.* and the parallel layout may change" in line
    assert _snapshot(run) == before


def test_optimizer_and_schedule_come_from_the_config_on_resume(trained, tmp_path, capsys):
    source, overrides = trained
    run = tmp_path / "extended"
    assert credit_main(["train", *overrides, f"run_dir={run}",
                        f"trainer.resume={source / 'checkpoints' / 'step_00000002'}",
                        "trainer.max_steps=4", "trainer.optimizer.lr=1e-4",
                        "trainer.optimizer.weight_decay=0.5"]) == 0
    out = capsys.readouterr().out
    assert "resume: trainer.optimizer.lr 0.002 -> 0.0001 (the config wins" in out
    assert "resume: trainer.optimizer.weight_decay 0.01 -> 0.5 (the config wins" in out
    assert "resume: trainer.max_steps 2 -> 4" in out
    assert "trainer.optimizer.eps" not in out  # unchanged values say nothing
    rows = {int(r["step"]): float(r["lr"]) for r in read_metrics(run / "metrics.csv")}
    schedule = WarmupCosine(warmup_steps=2, max_steps=4, min_lr_ratio=0.05)
    assert sorted(rows) == [3, 4]
    for step, lr in rows.items():  # the rebuilt schedule at the resumed step, the new base lr
        assert lr == pytest.approx(1e-4 * schedule(step - 1), rel=1e-12), step


def test_resume_auto_names_a_damaged_checkpoint_and_uses_the_last_good_one(trained, tmp_path, capsys):
    import shutil

    source, overrides = trained
    run = tmp_path / "copy"
    shutil.copytree(source, run)  # as a user copying a run, the last checkpoint half-way
    data = sorted((run / "checkpoints" / "step_00000002").glob("*.distcp"))[0]
    data.write_bytes(data.read_bytes()[:100])
    good = _snapshot(run / "checkpoints" / "step_00000001")
    assert credit_main(["train", *overrides, f"run_dir={run}", "trainer.max_steps=3"]) == 0
    out = capsys.readouterr().out
    assert (f"trainer.resume=auto skips damaged checkpoint {run / 'checkpoints' / 'step_00000002'}: "
            f"data file {data.name} is truncated (100 of ") in out
    assert f"resumed from {run / 'checkpoints' / 'step_00000001'} at step 1" in out
    assert _snapshot(run / "checkpoints" / "step_00000001") == good
    # named explicitly, a damaged checkpoint is one line saying what is wrong
    damaged = source / "checkpoints" / "step_00000002"
    shutil.copytree(damaged, tmp_path / "half")
    (tmp_path / "half" / ".metadata").unlink()
    assert credit_main(["train", *overrides, f"run_dir={tmp_path / 'other'}",
                        f"trainer.resume={tmp_path / 'half'}", "trainer.max_steps=3"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line == (f"error: checkpoint {tmp_path / 'half'} is not a complete DCP checkpoint directory: "
                    f"no .metadata (the save or a copy of it did not finish)")


def test_an_unexpected_error_is_one_line_unless_debug_asks(monkeypatch, capsys, tmp_path):
    def broken(cfg):
        raise RuntimeError("the disk went away\nsecond line")

    monkeypatch.setattr(credit.train, "run_training", broken)
    monkeypatch.delenv("CREDIT_DEBUG", raising=False)
    assert credit_main(["train", f"run_dir={tmp_path}"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line == ("error: RuntimeError: the disk went away (--debug or CREDIT_DEBUG=1 shows the "
                    "traceback)")
    try:
        with pytest.raises(RuntimeError, match="the disk went away"):
            credit_main(["train", "--debug", f"run_dir={tmp_path}"])
        assert os.environ["CREDIT_DEBUG"] == "1"  # --debug sets it for launched ranks
    finally:
        os.environ.pop("CREDIT_DEBUG", None)


@pytest.fixture
def poisoned_data(tiny_data, tmp_path):
    """The tiny dataset with NaN in T at every time from the 11th on in 2000's file."""
    import shutil

    import numpy as np
    import xarray as xr

    root = tmp_path / "data"
    shutil.copytree(tiny_data, root)
    with xr.open_dataset(root / "era5_2000.nc") as ds:
        edited = ds.load()
    edited["T"][10:] = np.nan
    edited.to_netcdf(root / "era5_2000.nc")
    return root


def test_nan_in_the_data_is_named_when_read_or_skipped_and_counted(poisoned_data, tmp_path, capsys):
    from tiny import tiny_overrides

    run = tmp_path / "run"
    overrides = tiny_overrides(poisoned_data, f"run_dir={run}", "trainer.max_steps=2")
    assert credit_main(["train", *overrides]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"non-finite values (NaN first) in 'T' of {poisoned_data / 'era5_2000.nc'} at time 2000-01-0" in line
    assert "level 500" in line and "data.nonfinite=skip_sample" in line
    assert not (run / "checkpoints").exists()

    assert credit_main(["train", *overrides, "data.nonfinite=skip_sample", f"run_dir={tmp_path / 'skip'}"]) == 0
    out = capsys.readouterr().out
    skipped = int(out.split("data.nonfinite=skip_sample: ")[1].split()[0])
    assert skipped > 0 and "training samples with non-finite values were skipped" in out


def test_a_data_error_in_a_loader_worker_is_one_line_naming_the_worker(poisoned_data, tmp_path, capsys):
    """torch re-raises a worker's error with the worker's whole traceback as its message; the
    CLI prints the worker's own line."""
    from tiny import tiny_overrides

    overrides = tiny_overrides(poisoned_data, f"run_dir={tmp_path / 'run'}", "trainer.max_steps=2",
                               "data.num_workers=2")
    assert credit_main(["train", *overrides]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"non-finite values (NaN first) in 'T' of {poisoned_data / 'era5_2000.nc'}" in line
    assert line.endswith("(in DataLoader worker process 0)") or line.endswith("(in DataLoader worker process 1)")
    assert "Traceback" not in line


def test_a_diverging_loss_says_the_inputs_were_finite(tiny_overrides, tmp_path, capsys):
    run = tmp_path / "run"
    code = credit_main(["train", *tiny_overrides(run, "trainer.max_steps=6", "trainer.optimizer.lr=1e30",
                                                 "trainer.scheduler.warmup_steps=1", "trainer.grad_clip=0")])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2
    assert "loss became" in line and "(the step's inputs and targets were all finite)" in line


def test_a_refused_multi_rank_job_prints_one_line_and_no_launcher_report(tiny_overrides, tmp_path):
    run = tmp_path / "run"
    lock = acquire(run)
    try:
        result = _cli("train", "--nproc", "2", "parallelism=ddp", *tiny_overrides(run, "trainer.max_steps=2"))
    finally:
        os.close(lock)
    assert result.returncode == 2
    assert f"run_dir {run} is in use by pid {os.getpid()}" in _one_error_line(result.stderr)
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr
    assert _snapshot(run) == {}


def test_resume_never_on_a_run_is_one_line_from_two_ranks_and_changes_nothing(tiny_overrides, tmp_path):
    # rank 0 judges the run directory and every rank raises its verdict: one line, not one a rank
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.csv").write_text("step,epoch,split,loss\n1,0,train,0.5\n")
    before = _snapshot(run)
    result = credit_command("train", "--nproc", "2", "parallelism=ddp",
                            *tiny_overrides(run, "trainer.max_steps=2", "trainer.resume=never"),
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 2, result.stderr[-2000:]
    assert "trainer.resume=never would overwrite it" in _one_error_line(result.stderr)
    assert _snapshot(run) == before
