"""Single-process training end to end: real files, real hydra composition, real DCP."""


import pytest

from credit.checkpoint.manager import CheckpointManager
from credit.config import compose_config
from credit.train import run_training
from credit.train.metrics import read_metrics

VARIABLES = ["U", "V", "T", "Q", "SP", "t2m"]


def train(overrides):
    return run_training(compose_config(overrides))


def losses(run_dir):
    return [(int(r["step"]), r["loss"]) for r in read_metrics(run_dir / "metrics.csv")]


def test_short_run_learns_and_writes_its_run_directory(tmp_path, tiny_overrides):
    run = tmp_path / "run"
    results = train(tiny_overrides(run, "trainer.max_steps=40", "trainer.checkpoint.every_n_steps=20",
                                   "trainer.valid_every_n_steps=20"))
    rows = read_metrics(run / "metrics.csv")
    assert [int(r["step"]) for r in rows] == list(range(1, 41))
    first = sum(float(r["loss"]) for r in rows[:5]) / 5
    last = sum(float(r["loss"]) for r in rows[-5:]) / 5
    assert last < 0.7 * first, (first, last)
    for row in rows:
        assert float(row["grad_norm"]) > 0 and float(row["lr"]) > 0 and float(row["samples_per_s"]) > 0
        assert float(row["peak_mem_mib"]) > 50 and row["peak_reserved_mib"] == ""  # CPU: peak RSS
    valid = read_metrics(run / "metrics.csv", "valid")
    assert [int(r["step"]) for r in valid] == [20, 40]
    for variable in VARIABLES:
        assert float(valid[-1][f"rmse_{variable}"]) > 0
        assert float(valid[-1][f"persistence_rmse_{variable}"]) > 0
        assert results[f"rmse_{variable}"] == pytest.approx(float(valid[-1][f"rmse_{variable}"]))
    assert (run / "loss.png").stat().st_size > 1000
    assert "max_steps: 40" in (run / "config.yaml").read_text()
    assert [s for s, _ in CheckpointManager(run / "checkpoints", 2).complete_checkpoints()] == [20, 40]


def test_resume_continues_the_same_trajectory_bitwise(tmp_path, tiny_overrides):
    common = ["trainer.max_steps=20", "trainer.checkpoint.every_n_steps=5",
              "trainer.checkpoint.keep_latest_k=1"]
    straight = tmp_path / "straight"
    train(tiny_overrides(straight, *common))
    resumed = tmp_path / "resumed"
    first_job = train(tiny_overrides(resumed, *common, "trainer.steps_per_job=10"))
    assert first_job  # validation still reports at the end of a job
    assert [s for s, _ in losses(resumed)] == list(range(1, 11))
    train(tiny_overrides(resumed, *common, "trainer.steps_per_job=10"))  # resume=auto
    assert losses(resumed) == losses(straight)  # raw strings: bitwise-equal floats
    assert len(losses(resumed)) == 20


def test_resume_from_an_explicit_checkpoint_path(tmp_path, tiny_overrides):
    source = tmp_path / "source"
    train(tiny_overrides(source, "trainer.max_steps=12", "trainer.checkpoint.every_n_steps=6",
                         "trainer.checkpoint.keep_latest_k=2"))
    checkpoint = source / "checkpoints" / "step_00000006"
    target = tmp_path / "target"
    train(tiny_overrides(target, "trainer.max_steps=12", f"trainer.resume={checkpoint}"))
    assert losses(target) == losses(source)[6:]


def test_resume_never_refuses_to_overwrite_an_existing_run(tmp_path, tiny_overrides):
    run = tmp_path / "run"
    train(tiny_overrides(run, "trainer.max_steps=3"))
    before = (run / "metrics.csv").read_text()
    with pytest.raises(FileExistsError, match="trainer.resume=never would overwrite"):
        train(tiny_overrides(run, "trainer.max_steps=3", "trainer.resume=never"))
    assert (run / "metrics.csv").read_text() == before
    assert CheckpointManager(run / "checkpoints", 1).latest() is not None


def test_gradient_accumulation_matches_one_larger_batch(tmp_path, tiny_overrides):
    big = tmp_path / "big"
    train(tiny_overrides(big, "trainer.max_steps=1", "trainer.batch_size=4"))
    accumulated = tmp_path / "accumulated"
    train(tiny_overrides(accumulated, "trainer.max_steps=1", "trainer.batch_size=2",
                         "trainer.grad_accum_steps=2"))
    a, b = read_metrics(big / "metrics.csv")[0], read_metrics(accumulated / "metrics.csv")[0]
    assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-5)
    assert float(a["grad_norm"]) == pytest.approx(float(b["grad_norm"]), rel=1e-4)


def test_multi_step_training_and_a_diagnostic_variable(tmp_path, tiny_overrides):
    run = tmp_path / "run"
    results = train(tiny_overrides(
        run, "trainer.max_steps=4", "data.forecast_len=2", "data.history_len=2",
        "data.variables.surface=[SP]", "data.variables.diagnostic=[t2m]",
        "+trainer.loss.variable_weights.t2m=2.0",
    ))
    assert "rmse_t2m" in results and "persistence_rmse_t2m" not in results
    assert "persistence_rmse_SP" in results
    assert all(float(r["loss"]) > 0 for r in read_metrics(run / "metrics.csv"))


def test_missing_variable_is_one_error_naming_it(tmp_path, tiny_overrides):
    from credit.data import DataError

    with pytest.raises(DataError, match="VORT"):
        train(tiny_overrides(tmp_path / "run", "data.variables.upper_air=[U,VORT]"))
    assert not (tmp_path / "run" / "metrics.csv").exists()


def test_the_final_table_keeps_its_columns_for_long_names():
    """ERA5's long variable names (CREDIT's gen2 files) do not push their numbers out of line."""
    from credit.train.run import skill_table

    table = skill_table({"rmse_U_500": 1.0, "persistence_rmse_U_500": 2.0,
                         "rmse_surface_net_thermal_radiation": 3.0}).splitlines()
    name_ends = [len(line.split()[0]) for line in table]
    model_ends = [line.index(value, end) + len(value)
                  for line, value, end in zip(table, ["RMSE", "1", "3"], name_ends)]
    assert len(set(model_ends)) == 1 and min(model_ends) - max(name_ends) > 3, table
    assert table[1].endswith("+50.0% better") and table[2].endswith("(diagnostic)"), table
