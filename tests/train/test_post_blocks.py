"""CREDIT's post blocks in `credit train` and `credit rollout` (`model.post_conf`).

A CrossFormer with the tracer fixer (T held at or above 250 K) inside its forward and the
pressure-level mass fixer after it, as CREDIT's trainer and rollout apply a fixer with
`activate_outside_model`, trains two steps of a two-step forecast on the tiny dataset, then
forecasts three leads. Every lead written keeps T at or above the threshold and the global
dry-air mass of the initial state, computed here independently (float64, CREDIT's cell areas
and trapezoid rule). A post block that names no channel of the data is one error line.
"""

import glob
import os
import subprocess

import numpy as np
import xarray as xr
from launches import credit_command
from tiny import TINY_LEVELS, post_block_overrides, tiny_data_overrides, write_physics_file

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
MODEL = ["model=wxformer", "model.dim=[8,16,32,64]", "model.dim_head=4", "model.local_window_size=[2,2,2,1]",
         "model.global_window_size=[2,2,1,1]", "data.forecast_len=2", "trainer.max_steps=2",
         "trainer.checkpoint.every_n_steps=0", "trainer.batch_size=2", "data.valid_samples=2"]
THRESHOLD = 250.0


def _credit(*args: str) -> subprocess.CompletedProcess:
    return credit_command(*args, env=ENV)


def _dry_air_mass(q: np.ndarray, physics: xr.Dataset) -> float:
    lat, lon = np.deg2rad(physics.lat2d.values), np.deg2rad(physics.lon2d.values)
    d_lambda = np.gradient(lon, axis=1, edge_order=2)
    d_lambda = (d_lambda + np.pi) % (2 * np.pi) - np.pi
    area = np.abs(6371000.0**2 * np.gradient(np.sin(lat), axis=0, edge_order=2) * d_lambda)
    dry = 1 - np.asarray(q, np.float64)
    column = (0.5 * (dry[:-1] + dry[1:]) * np.diff(physics.p_level.values)[:, None, None]).sum(0) / 9.80665
    return float((column * area).sum())


def test_training_and_rollout_apply_the_post_blocks(tiny_data, tmp_path):
    physics_file = write_physics_file(tiny_data, tmp_path / "physics.nc")
    overrides = tiny_data_overrides(tiny_data, *MODEL, *post_block_overrides(physics_file, outside=True,
                                                                             tracer_min=THRESHOLD),
                                    f"run_dir={tmp_path / 'run'}")
    trained = _credit("train", *overrides)
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-3000:]
    init = "2001-01-03T00:00"
    rollout = _credit("rollout", *overrides, f"rollout.init_times=[{init}]", "rollout.lead_steps=3",
                      "rollout.skill=false", "rollout.progress_bar=false")
    assert rollout.returncode == 0, rollout.stdout[-2000:] + rollout.stderr[-3000:]
    forecast = xr.open_dataset(glob.glob(str(tmp_path / "run" / "forecasts" / "*.nc"))[0])
    with xr.open_dataset(physics_file) as physics, \
            xr.open_dataset(glob.glob(str(tiny_data / "era5_2001*.nc"))[0]) as truth:
        initial = _dry_air_mass(truth.Q.sel(time=np.datetime64(init), level=TINY_LEVELS).values, physics)
        for lead in range(3):
            mass = _dry_air_mass(forecast.Q.isel(lead_time=lead).values, physics)
            assert abs(mass / initial - 1) < 1e-6, (lead, mass / initial - 1)
        assert float(truth.T.min()) < THRESHOLD  # the tracer fixer has work to do: the data go below it
    assert float(forecast.T.min()) >= THRESHOLD * (1 - 1e-6)


def test_a_post_block_naming_no_channel_of_the_data_is_one_error_line(tiny_data, tmp_path):
    physics_file = write_physics_file(tiny_data, tmp_path / "physics.nc")
    result = _credit("train", *tiny_data_overrides(tiny_data, *MODEL, *post_block_overrides(physics_file, outside=False),
                                                   "model.post_conf.tracer_fixer.tracer_name=[QQ]",
                                                   f"run_dir={tmp_path / 'run'}"))
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "post_conf.tracer_fixer.tracer_name=['QQ'] names no output channel" in errors[0]


def test_deterministic_training_on_credits_gen1_files_with_the_tracer_fixer(tmp_path):
    """CREDIT's gen1 statistics files are float64; its scaler applies them to the float32
    forecast without promoting it, and so must the post blocks here (a float64 forecast
    stopped the first deterministic step, whose fixed-order sums take float32)."""
    import yaml

    data = tmp_path / "data"
    generated = _credit("data", "generate", "--out", str(data), "--layout", "credit-gen1", "--grid", "16x32",
                        "--years", "2000", "2001", "--days-per-year", "4", "--no-progress")
    assert generated.returncode == 0, generated.stderr[-2000:]
    conf = yaml.safe_load((data / "credit.yml").read_text())
    conf["model"]["post_conf"] = {"activate": True, "tracer_fixer": {
        "activate": True, "denorm": True, "tracer_name": [conf["data"]["variables"][-1]], "tracer_thres": ["1e-10"]}}
    (data / "tracer.yml").write_text(yaml.safe_dump(conf))
    trained = _credit("train", "--credit-config", str(data / "tracer.yml"), "model.gemm=deterministic",
                      f"run_dir={tmp_path / 'run'}", "trainer.max_steps=2", "trainer.progress_bar=false",
                      "trainer.valid_every_n_steps=0", "data.valid_samples=2")
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-3000:]
    assert "tracer_fixer" in trained.stdout + trained.stderr
