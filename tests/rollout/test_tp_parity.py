"""A checkpoint trained with 2-way tensor parallelism gives the same forecasts rolled out in
one process as rolled out at tp=2 on two ranks (DCP reshards model and EMA weights)."""

import numpy as np
import xarray as xr
from parallel.launcher import run_ranks
from tiny import tiny_overrides

from credit.config import compose_config
from credit.rollout import run_rollout
from credit.rollout.skill import read_skill_csv
from credit.parallel import build_runtime
from credit.train.trainer import Trainer

INITS = "[2001-01-02T00,2001-01-04T06]"


def train_then_roll_out(train_overrides, rollout_overrides):
    cfg = compose_config(train_overrides)
    trainer = Trainer(cfg, build_runtime(cfg))
    trainer.setup()
    trainer.fit()
    result = run_rollout(compose_config(rollout_overrides))
    return [str(p) for p in result.forecasts], result.weights


def test_tp2_checkpoint_rolls_out_identically_in_one_process_and_at_tp2(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    common = tiny_overrides(tiny_data, f"run_dir={run_dir}", "trainer.batch_size=2",
                            "data.valid_samples=2", "trainer.max_steps=4", "trainer.ema.enabled=true",
                            "trainer.ema.decay=0.5", "trainer.checkpoint.every_n_steps=0",
                            f"rollout.init_times={INITS}", "rollout.lead_steps=3",
                            "rollout.progress_bar=false", "rollout.climatology_samples=8")
    tp2 = [*common, "parallelism=single", "trainer.parallelism.tensor=2"]
    results = run_ranks(train_then_roll_out, 2, tp2, [*tp2, f"rollout.output_dir={tmp_path / 'tp2'}"])
    tp2_files, weights = results[0]
    assert weights == "ema" and len(tp2_files) == 2 and results[1] == ([], "ema")

    single = run_rollout(compose_config([
        *common, "parallelism=single", f"rollout.output_dir={tmp_path / 'single'}",
        f"rollout.checkpoint={run_dir / 'checkpoints' / 'step_00000004'}"]))
    assert [p.name for p in single.forecasts] == [p.split("/")[-1] for p in tp2_files]
    for ours, theirs in zip(single.forecasts, tp2_files):
        a, b = xr.open_dataset(ours), xr.open_dataset(theirs)
        for name in a.data_vars:
            scale = float(np.abs(a[name].values).max())
            np.testing.assert_allclose(a[name].values, b[name].values, rtol=1e-5, atol=1e-5 * scale,
                                       err_msg=name)
    for ours, theirs in zip(read_skill_csv(tmp_path / "single" / "skill.csv"),
                            read_skill_csv(tmp_path / "tp2" / "skill.csv")):
        assert ours["channel"] == theirs["channel"]
        np.testing.assert_allclose(float(ours["rmse_model"]), float(theirs["rmse_model"]), rtol=1e-5)
