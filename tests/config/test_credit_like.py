"""`credit data generate --like CREDIT.yml`: data in exactly a CREDIT gen2 file's layout and a
copy of the file pointing at it. CREDIT's own gen2 files that map here (their whole text,
tests/fixtures/credit_configs/whole_files.json): each copy maps with no refusal and its data
read; CREDIT's current example (bridgescaler scaling, BaseLoss, its wxformer as it is) trains
two steps and rolls out."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
import yaml
from launches import credit_command

from credit.config import compose_config
from credit.data.from_config import build_dataset
from credit.data.generate import GenerateError
from credit.interop.command_line import credit_file_overrides
from credit.interop.config_file import map_credit_file
from credit.interop.generate_like import generate_like

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
WHOLE_FILES = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "credit_configs"
                          / "whole_files.json").read_text())["files"]
# (file, --grid): the smallest grids whose boundary padding tiles each model's windows
GEN2_FILES = [("config/gen_2/examples/example-v2026.2.yml", (32, 64)),
              ("config/gen_2/examples/example-end-to-end.yml", (32, 64)),
              ("config/gen_2/examples/wxformer_era5_025deg_6hr.yml", (64, 128)),
              ("config/gen_2/smoke/smoke_gen2_casper.yml", (64, 128)),
              ("config/gen_2/smoke/smoke_gen2_multistep_casper.yml", (32, 64)),
              ("config/gen_2/smoke/smoke_ensemble_gen2_casper.yml", (64, 128)),
              ("config/gen_2/examples/wxformer_npj_era5_028deg.yml", (64, 128))]


@pytest.fixture
def tmp_path(year_free_tmp_path):
    return year_free_tmp_path


def _like(tmp_path: Path, name: str, grid: tuple[int, int], days: int = 2,
          model: dict[str, Any] | None = None) -> Path:
    """`--like` CREDIT's file `name` (its `model` keys updated) into tmp_path / "data"."""
    conf = json.loads(json.dumps(WHOLE_FILES[name]))
    conf["model"].update(model or {})
    source = tmp_path / Path(name).name
    source.write_text(yaml.safe_dump(conf, sort_keys=False))
    return generate_like(source, tmp_path / "data", grid=grid, days=days)


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


def _two_steps_a_validation_a_forecast(tmp_path: Path, common: list[str]) -> Path:
    """`credit train` two steps with a validation after the second, then `credit rollout` one
    lead, on the copy under tmp_path / "data"; the first forecast file."""
    trained = credit_command("train", *common, "trainer.max_steps=2", "trainer.valid_every_n_steps=2",
                             "trainer.progress_bar=false", env=ENV)
    assert trained.returncode == 0, trained.stderr[-3000:]
    rows = (tmp_path / "data" / "run" / "metrics.csv").read_text().splitlines()
    assert sum(",train," in row for row in rows) == 2 and sum(",valid," in row for row in rows) == 1
    forecast = credit_command("rollout", *common, "rollout.lead_steps=1", env=ENV)
    assert forecast.returncode == 0, forecast.stderr[-3000:]
    files = sorted((tmp_path / "data" / "forecasts").glob("forecast_*.nc"))
    return files[0]


@pytest.mark.parametrize("name, grid", [("config/gen_2/examples/wxformer_npj_era5_028deg.yml", (64, 128)),
                                        ("config/gen_2/examples/wxformer_era5_025deg_6hr.yml", (64, 128))],
                         ids=["npj", "025deg_6hr"])
def test_the_other_gen2_examples_train_validate_and_roll_out(tmp_path, name, grid):
    """CREDIT's other gen2 examples, narrowed (stage widths and depths; the rest is the file's):
    the npj file's flat preblocks and its validation on `data` (it has no validation_data), two
    steps, a validation, a forecast."""
    copy = _like(tmp_path, name, grid)
    common = ["--credit-config", str(copy), "model.dim=[16,32,64,128]", "model.depth=[1,1,1,1]", "model.dim_head=8"]
    with xr.open_dataset(_two_steps_a_validation_a_forecast(tmp_path, common)) as ds:
        assert ds.data_vars and all(bool(np.isfinite(ds[v].values).all()) for v in ds.data_vars)


def test_the_end_to_end_example_scales_sp_per_grid_point_trains_and_forecasts(tmp_path):
    """CREDIT's `example-end-to-end.yml` with its log blocks naming precipitation as a list (the
    file gives a string, which CREDIT reads as characters: a no-op): SP scaled per grid point
    (its bridgescaler file, as generated, holds one statistic per point), precipitation logged
    before the scaler and exp'd after its inverse, BaseLoss in physical units; two steps with a
    validation, then a forecast whose SP and precipitation are back in the data's units."""
    conf = json.loads(json.dumps(WHOLE_FILES["config/gen_2/examples/example-end-to-end.yml"]))
    tp = ["ERA5/diagnostic/2d/total_precipitation"]
    conf["preblocks"]["per_step"]["log_trans"]["args"]["variables"] = tp
    for block in ("log_trans", "log_trans_target"):
        conf["postblocks"]["per_step"][block]["args"]["variables"] = tp
    conf["inference"]["postblocks"]["per_step"]["log_trans"]["args"]["variables"] = tp  # forecasts alike
    source = tmp_path / "example-end-to-end.yml"
    source.write_text(yaml.safe_dump(conf, sort_keys=False))
    copy = generate_like(source, tmp_path / "data", grid=(32, 64), days=2)
    common = ["--credit-config", str(copy)]
    first = _two_steps_a_validation_a_forecast(tmp_path, common)
    truth = sorted((tmp_path / "data").glob("**/ERA5_mlevel_1deg_6h_subset_*"))[0]
    with xr.open_dataset(first) as ds, xr.open_zarr(truth) as data:
        for var in ("SP", "total_precipitation"):  # an untrained model: within a few of the data's std
            values = ds[var].values
            assert bool(np.isfinite(values).all())
            assert abs(float(values.mean()) - float(data[var].mean())) < 5 * float(data[var].std()), var


def test_a_tisr_source_beside_the_files_trains_and_forecasts(tmp_path):
    """CREDIT's example with a `tisr` source after ERA5 (as its ARCO-ERA5 examples add one), in a
    CREDIT checkout's `config/` (whose `credit/metadata` holds the irradiance table): `--like`
    writes no data for it but copies the table beside the copy, resizes its grid specs and fits
    the statistics with its values; a step trains and a forecast reads it at every lead."""
    checkout = tmp_path / "miles-credit"
    table = checkout / "credit" / "metadata" / "total_solar_irradiance_CMIP6_49r1.nc"
    table.parent.mkdir(parents=True)
    years = np.arange(1850.5, 2300.5, dtype=np.float32)  # CREDIT's span, synthetic values
    xr.Dataset({"tsi": ("time", (1361 + np.sin(years)).astype(np.float32))}, coords={"time": years}).to_netcdf(table)
    conf = json.loads(json.dumps(WHOLE_FILES["config/gen_2/examples/example-v2026.2.yml"]))
    solar = {"dataset_type": "tisr", "num_integration_steps": 36, "lat_spec": [90, -90, 181],
             "lon_spec": [0, 359, 360], "variables": {"prognostic": None, "diagnostic": None, "static": None,
                                                      "dynamic_forcing": {"vars_2D": ["tisr"]}}}
    conf["data"]["source"]["SOLAR"] = conf["validation_data"]["source"]["SOLAR"] = solar
    conf["model"]["input_only_channels"] += 1
    source = checkout / "config" / "gen_2" / "examples" / "with_tisr.yml"
    source.parent.mkdir(parents=True)
    source.write_text(yaml.safe_dump(conf, sort_keys=False))
    copy = generate_like(source, tmp_path / "data", grid=(32, 64), days=2)
    copied = yaml.safe_load(copy.read_text())["data"]["source"]["SOLAR"]
    assert copied["lat_spec"] == [90, -90, 32] and copied["lon_spec"] == [0, 354.375, 64]
    assert (tmp_path / "data" / "credit" / "metadata" / table.name).read_bytes() == table.read_bytes()
    cfg = compose_config(credit_file_overrides(["--credit-config", str(copy)])[0])
    assert list(cfg.data.variables.forcing)[-1] == "tisr" and cfg.data.credit.tisr.source == "SOLAR"
    common = ["--credit-config", str(copy)]
    trained = credit_command("train", *common, "trainer.max_steps=1", "trainer.valid_every_n_steps=0",
                             "trainer.progress_bar=false", env=ENV)
    assert trained.returncode == 0, trained.stderr[-3000:]
    forecast = credit_command("rollout", *common, "rollout.lead_steps=2", env=ENV)
    assert forecast.returncode == 0, forecast.stderr[-3000:]
    assert sorted((tmp_path / "data" / "forecasts").glob("forecast_*.nc"))


def test_a_grid_the_windows_cannot_tile_is_one_error(tmp_path):
    from credit.data.generate import GenerateError

    with pytest.raises(GenerateError, match=r"--grid 16x32: .* multiple of 64, .* at least 22"):
        _like(tmp_path, "config/gen_2/examples/example-v2026.2.yml", (16, 32))
    assert not any((tmp_path / "data").glob("*.zarr"))


def test_a_run_length_given_on_the_command_line_wins_over_the_files_epochs(tmp_path):
    """CREDIT's epochs set the run's length at start (epochs x batches per pass); a
    `trainer.max_steps` (or `steps_per_job`) the user gives is the length instead."""
    source = tmp_path / "example.yml"
    source.write_text(yaml.safe_dump(WHOLE_FILES["config/gen_2/examples/wxformer_era5_025deg_6hr.yml"], sort_keys=False))
    overrides, _ = credit_file_overrides(["--credit-config", str(source)])
    assert "trainer.epochs=70" in overrides
    overrides, _ = credit_file_overrides(["--credit-config", str(source), "trainer.max_steps=2",
                                   "trainer.steps_per_job=1"])
    assert not [o for o in overrides if o.startswith(("trainer.epochs=", "trainer.epochs_per_job="))]
    cfg = compose_config(overrides)
    assert (cfg.trainer.max_steps, cfg.trainer.steps_per_job, cfg.trainer.epochs) == (2, 1, 0)


# CREDIT's gen1 files that map here (docs/credit_config.md's table), each with the smallest grid
# its windows tile (the 0.25-degree wxformers: a multiple of 160 once padded)
GEN1_FILES = [("config/example-v2026.1.0.yml", (32, 64)),
              ("config/gen_1/applications/climate/climate_rollout.yml", (32, 64)),
              ("config/gen_1/applications/other_models/wxformer_1dg_test.yml", (32, 64)),
              ("config/gen_1/arXiv_2024/wxformer_1h_single_step.yml", (64, 128)),
              ("config/gen_1/arXiv_2024/wxformer_6h_multi_step.yml", (64, 128)),
              ("config/gen_1/arXiv_2024/wxformer_6h_single_step.yml", (64, 128)),
              ("config/gen_1/archive/v1/wxformer_1dg_6hr.yml", (32, 64)),
              ("config/gen_1/archive/v1/wxformer_1hr.yml", (64, 128)),
              ("config/gen_1/archive/v1/wxformer_6hr.yml", (64, 128)),
              ("config/gen_1/example/example-v2026.1.0.yml", (32, 64)),
              ("config/gen_1/applications/ensemble/test_cesm_ensemble.yml", (32, 64)),
              ("config/gen_2/smoke/smoke_v2branch_casper.yml", (64, 128))]


# CREDIT's climate run counts 3 surface and 3 input-only channels for its 2 surface and 4
# forcing and static variables: refused (docs/credit_config.md), then read with the counts fixed
MISCOUNTED = {"config/gen_1/applications/climate/climate_rollout.yml": {"surface_channels": 2, "input_only_channels": 4}}


@pytest.mark.parametrize("name, grid", GEN1_FILES, ids=[f"{Path(n).parent.name}/{Path(n).stem}" for n, _ in GEN1_FILES])
def test_a_gen1_copy_maps_and_its_data_read(tmp_path, name, grid):
    original = WHOLE_FILES[name]
    if name in MISCOUNTED:  # one line naming the first key, before anything is written
        with pytest.raises(GenerateError, match=r"model\.surface_channels: 3, but data\.surface_variables name 2: the "
                                                r"file's model: section counts other channels than its data: section"):
            _like(tmp_path, name, grid, days=1)
        assert not (tmp_path / "data").exists()
    copy = _like(tmp_path, name, grid, days=1, model=MISCOUNTED.get(name))
    conf = yaml.safe_load(copy.read_text())
    assert map_credit_file(conf).refused == []  # not even a path that matches no file
    overrides, _ = credit_file_overrides(["--credit-config", str(copy)])  # the whole file, its model too, as `credit train`
    cfg = compose_config(overrides)
    train, valid = build_dataset(cfg.data, "train_period"), build_dataset(cfg.data, "valid_period")
    assert train.grid_shape == grid and len(train.levels) == original["model"]["levels"]
    assert (cfg.model.image_height, cfg.model.image_width) == grid
    first = [int(original["data"][key][0]) for key in ("train_years", "valid_years")]
    assert [conf["data"][key] for key in ("train_years", "valid_years")] == [[y, y + 1] for y in first]
    sample = valid[0]
    assert all(bool(sample[k].isfinite().all()) for k in ("state", "forcing", "target"))
    # the upper-air and surface channels of a state are the file's variables on its levels
    data = original["data"]
    assert sample["state"].shape[1] == len(data["variables"]) * len(train.levels) + len(data["surface_variables"])
    for key in ("variables", "surface_variables", "dynamic_forcing_variables", "static_variables"):
        assert conf["data"].get(key) == data.get(key)
    assert not conf["trainer"].get("load_weights")  # a fresh start: the copy's save_loc holds no checkpoint


def test_a_gen1_copy_holds_what_the_conservation_fixers_read(tmp_path):
    """CREDIT's climate run: mass, water and energy fixers on 32 hybrid-sigma levels read the
    physics file's 2-D grid, interface coefficients and surface geopotential."""
    from credit.models.credit.postblocks.settings import column_physics, physics_field

    name = "config/gen_1/applications/climate/climate_rollout.yml"
    copy = _like(tmp_path, name, (32, 64), model=MISCOUNTED[name])
    conf = yaml.safe_load(copy.read_text())
    post = conf["model"]["post_conf"]
    path = Path(conf["data"]["save_loc_physics"])
    physics = column_physics(post, path, "data.save_loc_physics")
    assert physics.sigma and physics.levels() == 32 and tuple(physics.area.shape) == (32, 64)
    assert bool((physics.area > 0).all())
    geopotential = physics_field(path, "PHIS", "data.save_loc_physics", "surface_geopotential_name")
    assert tuple(geopotential.shape) == (32, 64)
    with xr.open_dataset(path) as ds:  # CREDIT's latitude weights live in the same file here
        assert "coslat" in ds and "z_norm" in ds


def test_credits_gen1_example_trains_and_forecasts_from_the_validation_year(tmp_path):
    """The copy of CREDIT's gen1 example trains (its model as it is, on the copy's grid); its
    forecast starts at the validation year's first time (rolling out a copy: the gen2 test)."""
    copy = _like(tmp_path, "config/gen_1/example/example-v2026.1.0.yml", (32, 64))
    trained = credit_command("train", "--credit-config", str(copy), "trainer.max_steps=1",
                             "trainer.valid_every_n_steps=0", "trainer.progress_bar=false", env=ENV)
    assert trained.returncode == 0, trained.stderr[-3000:]
    rows = (tmp_path / "data" / "run" / "metrics.csv").read_text().splitlines()
    assert sum(",train," in row for row in rows) == 1
    cfg = compose_config(list(map_credit_file(yaml.safe_load(copy.read_text())).overrides))
    assert list(cfg.rollout.init_times) == ["2014-01-01T00:00"] and cfg.rollout.lead_steps == 4  # one day of 6 h


def test_a_gen1_glob_without_a_year_wildcard_is_one_error_before_writing(tmp_path):
    from credit.data.generate import GenerateError

    conf = json.loads(json.dumps(WHOLE_FILES["config/gen_1/arXiv_2024/wxformer_6h_single_step.yml"]))
    conf["data"]["save_loc_surface"] = "/glade/data/surface_all_years.zarr"
    source = tmp_path / "one_file.yml"
    source.write_text(yaml.safe_dump(conf))
    with pytest.raises(GenerateError, match=r"data.save_loc_surface: '/glade/data/surface_all_years.zarr' has no "
                                            r"wildcard for the year"):
        generate_like(source, tmp_path / "data", grid=(64, 128))
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())


def _gen1_variant(tmp_path: Path, **data: Any) -> Path:
    """CREDIT's 1-degree gen1 wxformer file with `data` keys changed (a forcing file's
    variables counted in the model's input-only channels)."""
    conf = json.loads(json.dumps(WHOLE_FILES["config/gen_1/archive/v1/wxformer_1dg_6hr.yml"]))
    conf["data"].update(data)
    conf["model"]["input_only_channels"] += len(data.get("forcing_variables", []))
    source = tmp_path / "variant.yml"
    source.write_text(yaml.safe_dump(conf))
    return source


def test_odd_gen1_globs_and_shared_files_read(tmp_path):
    """A year wildcard with text after it, a `.nc4` solar folder, a forcing file that is also
    the static file, and a 48-hour step: the copy composes and its data read."""
    source = _gen1_variant(tmp_path, save_loc="/glade/y/SixHourly_y_TOTAL*12-31_staged.zarr",
                           save_loc_surface="/glade/y/SixHourly_y_TOTAL*12-31_staged.zarr",
                           save_loc_dynamic_forcing="/glade/solar/*.nc4", forcing_variables=["TSI"],
                           save_loc_forcing="/glade/static/static.nc", save_loc_static="/glade/static/static.nc",
                           lead_time_periods=48)
    copy = generate_like(source, tmp_path / "data", grid=(32, 64), days=1)
    assert sorted(p.name for p in (tmp_path / "data" / "y").iterdir()) == [
        "SixHourly_y_TOTAL_1979_12-31_staged.zarr", "SixHourly_y_TOTAL_2018_12-31_staged.zarr"]
    assert sorted(p.name for p in (tmp_path / "data" / "solar").iterdir()) == ["1979.nc4", "2018.nc4"]
    with xr.open_dataset(tmp_path / "data" / "static" / "static.nc") as ds:
        assert {"TSI", "Z_GDS4_SFC", "LSM"} <= set(ds.data_vars) and ds["TSI"].dims[0] == "time"
    overrides, _ = credit_file_overrides(["--credit-config", str(copy)])
    cfg = compose_config(overrides)
    assert cfg.rollout.lead_steps == 1  # one 48-hour step: the copy's forecast is two days
    sample = build_dataset(cfg.data, "valid_period")[0]
    assert all(bool(sample[k].isfinite().all()) for k in ("state", "forcing", "target"))


@pytest.mark.parametrize("data, message", [
    (dict(save_loc="/glade/a/ERA5_*", save_loc_surface="/glade/a/ERA5_sfc_*"),
     r"data.save_loc: '/glade/a/ERA5_\*' would also read \['ERA5_sfc_1979.zarr', 'ERA5_sfc_2018.zarr'\], written "
     r"for another key"),
    (dict(std_path="/glade/stats/mean.nc", mean_path="/glade/stats/mean.nc"),
     r"data.mean_path and data.std_path name one file"),
], ids=["a glob reads another's files", "mean and std one file"])
def test_gen1_files_that_would_read_each_other_are_one_error_before_writing(tmp_path, data, message):
    from credit.data.generate import GenerateError

    with pytest.raises(GenerateError, match=message):
        generate_like(_gen1_variant(tmp_path, **data), tmp_path / "data", grid=(32, 64))
    assert not (tmp_path / "data").exists()


def test_an_out_folder_with_the_other_year_in_its_path_is_one_error(tmp_path):
    """CREDIT's own gen1 reader takes a year's files by the year anywhere in the path: an
    --out named after the validation year would have it read the training file as that year."""
    from credit.data.generate import GenerateError

    with pytest.raises(GenerateError, match=r"CREDIT's year filter .* as 2018; choose an --out without year strings"):
        generate_like(_gen1_variant(tmp_path), tmp_path / "run2018", grid=(32, 64))
    assert not (tmp_path / "run2018").exists()


@pytest.mark.parametrize("name", ["config/gen_2/examples/example-v2026.2.yml", "config/example-v2026.1.0.yml"],
                         ids=["gen2", "gen1"])
def test_a_model_grid_other_than_the_datas_is_one_line_naming_both(tmp_path, name):
    """The copy's data are 32 x 64; its model section set to 64 x 64 (a grid its windows do
    not tile with the copy's padding) stops with the grid, not the window-tiling message."""
    copy = _like(tmp_path, name, (32, 64), days=1)
    conf = yaml.safe_load(copy.read_text())
    conf["model"]["image_height"] = 64
    copy.write_text(yaml.safe_dump(conf, sort_keys=False))
    with pytest.raises(ValueError, match=r"model.image_height x image_width = 64 x 64, but the data \(.*\) are on a "
                                         r"32 x 64 grid \(latitude x longitude\)"):
        credit_file_overrides(["--credit-config", str(copy)])
    conf["model"]["image_height"] = 32
    copy.write_text(yaml.safe_dump(conf, sort_keys=False))
    assert credit_file_overrides(["--credit-config", str(copy)])[0]  # the data's grid maps
