"""`credit data generate --like CREDIT.yml`: data in exactly a CREDIT gen2 file's layout and a
copy of the file pointing at it. CREDIT's own gen2 files that map here (their whole text,
tests/fixtures/credit_configs/whole_files.json): each copy maps with no refusal and its data
read; CREDIT's current example (bridgescaler scaling, BaseLoss, its wxformer as it is) trains
two steps and rolls out."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import xarray as xr
import yaml
from launches import credit_command

from credit.config import compose_config
from credit.data.from_config import build_dataset
from credit.interop.config_file import map_credit_file
from credit.interop.generate_like import generate_like

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
WHOLE_FILES = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "credit_configs"
                          / "whole_files.json").read_text())["files"]
# (file, --grid): the smallest grids whose boundary padding tiles each model's windows
GEN2_FILES = [("config/gen_2/examples/example-v2026.2.yml", (32, 64)),
              ("config/gen_2/examples/wxformer_era5_025deg_6hr.yml", (64, 128)),
              ("config/gen_2/smoke/smoke_gen2_casper.yml", (64, 128)),
              ("config/gen_2/smoke/smoke_gen2_multistep_casper.yml", (32, 64))]


def _like(tmp_path: Path, name: str, grid: tuple[int, int]) -> Path:
    source = tmp_path / Path(name).name
    source.write_text(yaml.safe_dump(WHOLE_FILES[name], sort_keys=False))
    return generate_like(source, tmp_path / "data", grid=grid)


@pytest.mark.parametrize("name, grid", GEN2_FILES, ids=[Path(n).stem for n, _ in GEN2_FILES])
def test_the_copy_maps_and_its_data_read(tmp_path, name, grid):
    copy = _like(tmp_path, name, grid)
    conf = yaml.safe_load(copy.read_text())
    mapping = map_credit_file(conf)
    assert mapping.refused == []  # not even a path that matches no file
    cfg = compose_config(list(mapping.overrides))
    train, valid = build_dataset(cfg.data, "train_period"), build_dataset(cfg.data, "valid_period")
    assert train.grid_shape == grid and len(train.levels) == len(WHOLE_FILES[name]["data"]["source"]
                                                                  [next(iter(WHOLE_FILES[name]["data"]["source"]))]
                                                                  ["levels"])
    sample = valid[0]
    assert all(bool(sample[k].isfinite().all()) for k in ("state", "forcing", "target"))
    # only paths, periods and the grid changed: the variables and the model's widths are the file's
    original = WHOLE_FILES[name]
    assert conf["data"]["source"].keys() == original["data"]["source"].keys()
    assert conf["model"]["dim"] == original["model"]["dim"] and conf["model"]["image_height"] == grid[0]


def test_credits_example_trains_two_steps_and_rolls_out(tmp_path):
    copy = _like(tmp_path, "config/gen_2/examples/example-v2026.2.yml", (32, 64))
    common = ["--credit-config", str(copy)]
    trained = credit_command("train", *common, "trainer.max_steps=2", "trainer.valid_every_n_steps=0",
                             "trainer.progress_bar=false", env=ENV)
    assert trained.returncode == 0, trained.stderr[-3000:]
    rows = (tmp_path / "data" / "run" / "metrics.csv").read_text().splitlines()
    assert sum(",train," in row for row in rows) == 2
    forecast = credit_command("rollout", *common, "rollout.lead_steps=2", env=ENV)
    assert forecast.returncode == 0, forecast.stderr[-3000:]
    files = sorted((tmp_path / "data" / "forecasts").glob("forecast_*.nc"))
    with xr.open_dataset(files[0]) as ds:
        assert "temperature" in ds.data_vars and bool(ds["temperature"].notnull().all())


def test_a_grid_the_windows_cannot_tile_is_one_error(tmp_path):
    from credit.data.generate import GenerateError

    with pytest.raises(GenerateError, match=r"--grid 16x32: .* multiple of 64, .* at least 22"):
        _like(tmp_path, "config/gen_2/examples/example-v2026.2.yml", (16, 32))
    assert not any((tmp_path / "data").glob("*.zarr"))


def test_a_run_length_given_on_the_command_line_wins_over_the_files_epochs(tmp_path):
    """CREDIT's epochs set the run's length at start (epochs x batches per pass); a
    `trainer.max_steps` (or `steps_per_job`) the user gives is the length instead."""
    from credit.cli import _credit_config

    source = tmp_path / "example.yml"
    source.write_text(yaml.safe_dump(WHOLE_FILES["config/gen_2/examples/wxformer_era5_025deg_6hr.yml"], sort_keys=False))
    overrides, _ = _credit_config(["--credit-config", str(source)])
    assert "trainer.epochs=70" in overrides
    overrides, _ = _credit_config(["--credit-config", str(source), "trainer.max_steps=2",
                                   "trainer.steps_per_job=1"])
    assert not [o for o in overrides if o.startswith(("trainer.epochs=", "trainer.epochs_per_job="))]
    cfg = compose_config(overrides)
    assert (cfg.trainer.max_steps, cfg.trainer.steps_per_job, cfg.trainer.epochs) == (2, 1, 0)
