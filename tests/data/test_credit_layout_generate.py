"""The synthetic dataset in NCAR CREDIT's gen1 layout: file names, dims, dtypes, values, credit.yml."""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

from credit.data import generate_dataset
from credit.interop.generate_gen1 import crossformer_section, generate_credit_gen1
from credit.data.generate import GenerateError

KW = dict(grid=(8, 16), years=(2000, 2001), levels=(500, 850), days_per_year=3, seed=5, progress=False)
UPPER_AIR = ("U", "V", "T", "Q")
SURFACE_AND_FORCING = ("SP", "t2m", "tsi")
FILES = ("ERA5_gen1_6h_2000.nc", "ERA5_gen1_6h_2001.nc", "static.nc", "mean_6h_2000_2000.nc",
         "std_6h_2000_2000.nc", "latitude_weights.nc", "credit.yml")


def _load(path):
    with xr.open_dataset(path) as ds:
        return ds.load()


@pytest.fixture(scope="module")
def gen1(tmp_path_factory) -> Path:
    return generate_credit_gen1(tmp_path_factory.mktemp("credit_gen1"), **KW)


@pytest.fixture(scope="module")
def ours(tmp_path_factory) -> Path:
    """Our own layout from the same arguments."""
    return generate_dataset(tmp_path_factory.mktemp("ours"), **KW)


@pytest.fixture(scope="module")
def conf(gen1) -> dict:
    return yaml.safe_load((gen1 / "credit.yml").read_text())


def test_files_have_credit_names_dims_and_dtypes(gen1, ours):
    assert sorted(p.name for p in gen1.iterdir()) == sorted(FILES)  # no temporary folder left behind
    ref = _load(ours / "era5_2000.nc")
    for year in (2000, 2001):
        ds = _load(gen1 / f"ERA5_gen1_6h_{year}.nc")
        assert set(ds.data_vars) == set(UPPER_AIR + SURFACE_AND_FORCING)
        for v in UPPER_AIR:
            assert ds[v].dims == ("time", "level", "latitude", "longitude") and ds[v].dtype == np.float32, v
        for v in SURFACE_AND_FORCING:
            assert ds[v].dims == ("time", "latitude", "longitude") and ds[v].dtype == np.float32, v
        assert ds.sizes == {"time": 12, "level": 2, "latitude": 8, "longitude": 16}
        assert ds["latitude"].values[0] == 90.0 and ds["latitude"].values[-1] == -90.0
        assert np.all(np.diff(ds["latitude"].values) < 0)
        assert ds["time"].values[0] == np.datetime64(f"{year}-01-01T00:00")
        assert ds["time"].encoding["units"] == ref["time"].encoding["units"] == "hours since 1900-01-01"
        assert ds["time"].encoding["dtype"] == ref["time"].encoding["dtype"]
    static = _load(gen1 / "static.nc")
    assert set(static.data_vars) == {"Z_GDS4_SFC", "LSM"}
    for v in static.data_vars:
        assert static[v].dims == ("latitude", "longitude") and static[v].dtype == np.float32
    latw = _load(gen1 / "latitude_weights.nc")
    assert latw["coslat"].dims == ("latitude", "longitude")
    assert latw["latitude"].equals(ref["latitude"]) and latw["longitude"].equals(ref["longitude"])
    np.testing.assert_allclose(latw["coslat"].values[:, 10], np.cos(np.deg2rad(ref["latitude"].values)), atol=1e-15)


def test_statistics_are_ours_in_float64_on_the_data_level_coordinate(gen1, ours):
    data = _load(gen1 / "ERA5_gen1_6h_2000.nc")
    for name in ("mean", "std"):
        ds, ref = _load(gen1 / f"{name}_6h_2000_2000.nc"), _load(ours / f"{name}.nc")
        assert set(ds.data_vars) == set(UPPER_AIR + SURFACE_AND_FORCING)  # no static variables
        assert ds["level"].equals(data["level"])  # CREDIT's training_data_check compares with .equals
        assert ds["level"].dtype == data["level"].dtype
        for v in UPPER_AIR:
            assert ds[v].dims == ("level",) and ds[v].dtype == np.float64
            assert np.array_equal(ds[v].values, ref[v].sel(level=ds["level"]).values.astype(np.float64)), (name, v)
        for v in SURFACE_AND_FORCING:
            assert ds[v].dims == () and ds[v].dtype == np.float64
            assert ds[v].values == np.float64(ref[v].values), (name, v)
    assert np.all(_load(gen1 / "std_6h_2000_2000.nc")["T"].values > 0)


def test_values_equal_the_generator_for_the_same_time_and_level(gen1, ours):
    for year in (2000, 2001):
        ds = _load(gen1 / f"ERA5_gen1_6h_{year}.nc")
        era5, forcing = _load(ours / f"era5_{year}.nc"), _load(ours / f"forcing_{year}.nc")
        times = ds["time"].values
        assert np.array_equal(times, era5["time"].values)
        for t in (0, len(times) - 1):
            for level in (850, 500):
                for v in UPPER_AIR:
                    got = ds[v].sel(time=times[t], level=level).values
                    assert np.array_equal(got, era5[v].sel(time=times[t], level=level).values), (year, t, level, v)
        for v in ("SP", "t2m"):
            assert np.array_equal(ds[v].values, era5[v].values), v
        assert np.array_equal(ds["tsi"].values, forcing["tsi"].values)


def test_static_fields_are_normalised_as_credit_expects(gen1, ours):
    static, ref = _load(gen1 / "static.nc"), _load(ours / "static.nc")
    mean, std = _load(ours / "mean.nc"), _load(ours / "std.nc")
    z = static["Z_GDS4_SFC"]
    expected = (ref["Z_GDS4_SFC"].values.astype(np.float64) - float(mean["Z_GDS4_SFC"])) / float(std["Z_GDS4_SFC"])
    np.testing.assert_allclose(z.values, expected, rtol=1e-6, atol=1e-6)
    assert abs(float(z.mean())) < 1e-3 and abs(float(z.std()) - 1.0) < 1e-3  # O(1), unlike the raw m2 s-2
    assert float(ref["Z_GDS4_SFC"].max()) > 100.0
    assert z.attrs["normalisation_std"] == float(std["Z_GDS4_SFC"])
    assert np.array_equal(static["LSM"].values, ref["LSM"].values)
    assert set(np.unique(static["LSM"].values)) <= {0.0, 1.0}


def test_config_has_credit_keys_existing_paths_and_matching_globs(gen1, conf):
    assert "credit data generate --layout credit-gen1" in (gen1 / "credit.yml").read_text().splitlines()[0]
    assert list(conf) == ["save_loc", "seed", "data", "model", "loss", "trainer", "predict"]
    assert conf["save_loc"] == str(gen1 / "credit_run") and conf["seed"] == 5
    data = conf["data"]
    yearly = [str(gen1 / f"ERA5_gen1_6h_{y}.nc") for y in (2000, 2001)]
    for key in ("save_loc", "save_loc_surface", "save_loc_dynamic_forcing"):
        assert Path(data[key]).is_absolute() and sorted(glob.glob(data[key])) == yearly, key
    for key in ("save_loc_static", "mean_path", "std_path"):
        assert Path(data[key]).is_absolute() and Path(data[key]).is_file(), key
    assert Path(conf["loss"]["latitude_weights"]).is_file()
    assert data["variables"] == list(UPPER_AIR) and data["surface_variables"] == ["SP", "t2m"]
    assert data["dynamic_forcing_variables"] == ["tsi"] and data["static_variables"] == ["Z_GDS4_SFC", "LSM"]
    assert data["diagnostic_variables"] == [] and data["forcing_variables"] == []
    assert data["level_ids"] == [500, 850] and data["levels"] == 2 == conf["model"]["levels"]
    for key, value in dict(history_len=1, valid_history_len=1, forecast_len=0, valid_forecast_len=0,
                           lead_time_periods=6, skip_periods=1, static_first=True, scaler_type="std_new",
                           dataset_type="ERA5_MultiStep_Batcher").items():
        assert data[key] == value, key
    # CREDIT's end year is exclusive and it keeps a file when a year string is in its path
    assert data["train_years"] == [2000, 2001] and data["valid_years"] == [2001, 2002]
    for key, want in (("train_years", yearly[:1]), ("valid_years", yearly[1:])):
        years = [str(y) for y in range(*data[key])]
        assert [f for f in sorted(glob.glob(data["save_loc"])) if any(y in f for y in years)] == want
    model = conf["model"]
    assert model["type"] == "crossformer" and (model["image_height"], model["image_width"]) == (8, 16)
    assert (model["channels"], model["surface_channels"], model["input_only_channels"],
            model["output_only_channels"], model["frames"]) == (4, 2, 3, 0, 1)
    assert model["padding_conf"] == {"activate": False} and model["post_conf"] == {"activate": False}
    loss = conf["loss"]
    assert (loss["training_loss"], loss["validation_loss"], loss["use_latitude_weights"],
            loss["use_variable_weights"]) == ("mse", "mae", True, False)
    trainer = conf["trainer"]
    for key in ("mode", "type", "learning_rate", "weight_decay", "train_batch_size", "valid_batch_size",
                "batches_per_epoch", "valid_batches_per_epoch", "epochs", "num_epoch", "start_epoch",
                "grad_max_norm", "amp", "activation_checkpoint", "use_scheduler", "load_weights",
                "thread_workers", "valid_thread_workers", "skip_validation", "save_best_weights", "use_ema"):
        assert key in trainer, key
    assert trainer["type"] == "era5-gen1" and trainer["mode"] == "none" and trainer["thread_workers"] == 1
    assert trainer["grad_max_norm"] > 0  # CREDIT's gen1 trainer fails on None
    forecasts = conf["predict"]["forecasts"]
    assert (forecasts["type"], forecasts["start_year"], forecasts["start_month"], forecasts["start_day"]) == (
        "custom", 2001, 1, 1)
    assert conf["predict"]["mode"] == "none" and Path(conf["predict"]["save_forecast"]).is_absolute()


@pytest.mark.parametrize("grid", [(8, 16), (16, 32), (32, 64), (24, 48), (64, 128)])
def test_crossformer_section_fits_the_grid(grid):
    """CREDIT's CrossFormer: stage sizes after each stride divisible by the local and global windows;
    stages 2-4 halve exactly (its decoder concatenates upsampled maps with them)."""
    m = crossformer_section(grid, 2)
    h, w, sizes = *grid, []
    for s in m["cross_embed_strides"]:
        assert h % s == 0 and w % s == 0
        h, w = h // s, w // s
        sizes.append((h, w))
    for (a, b), g in zip(sizes, m["global_window_size"]):
        assert a % g == 0 and b % g == 0 and a % m["local_window_size"] == 0 and b % m["local_window_size"] == 0
    assert m["cross_embed_strides"][1:] == [2, 2, 2]
    for kernels, s in zip(m["cross_embed_kernel_sizes"], m["cross_embed_strides"]):
        assert all((k - s) % 2 == 0 for k in kernels)  # symmetric padding keeps size // stride
    if grid == (32, 64):
        assert m["cross_embed_strides"] == [2, 2, 2, 2] and m["global_window_size"] == [8, 4, 2, 1]
        assert m["local_window_size"] == 2


def test_second_call_without_overwrite_refuses_and_leaves_the_files(gen1):
    before = {p.name: p.read_bytes() for p in gen1.iterdir()}
    with pytest.raises(GenerateError, match="not empty"):
        generate_credit_gen1(gen1, **KW)
    assert {p.name: p.read_bytes() for p in gen1.iterdir()} == before


def test_overwrite_replaces_only_its_own_files(tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    (out / "ERA5_gen1_6h_1999.nc").write_text("stale year: CREDIT's glob would pick it up")
    generate_credit_gen1(out, **(KW | dict(years=(2000,), days_per_year=1)), overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["notes.txt", "ERA5_gen1_6h_2000.nc", "static.nc", "mean_6h_2000_2000.nc", "std_6h_2000_2000.nc",
         "latitude_weights.nc", "credit.yml"])
    conf = yaml.safe_load((out / "credit.yml").read_text())
    assert conf["data"]["train_years"] == [2000, 2001] and conf["data"]["valid_years"] == [2000, 2001]


@pytest.mark.parametrize("kw, match", [
    (dict(years=(2000, 2001, 2002), train_years=(2000, 2002)), "consecutive"),
    (dict(years=(2000, 2001, 2003), train_years=(2001,)), "consecutive"),
    (dict(grid=(12, 24)), "multiples of 8"),
    (dict(grid=(8, 8)), "longitudes"),
    (dict(grid=(2, 16)), "grid must be"),
    (dict(days_per_year=0), "days_per_year"),
    (dict(train_years=(1999,)), "subset"),
])
def test_invalid_arguments_raise_before_writing(tmp_path, kw, match):
    out = tmp_path / "never"
    with pytest.raises(GenerateError, match=match):
        generate_credit_gen1(out, **(KW | kw))
    assert not out.exists()


def test_output_path_with_a_year_string_is_refused(tmp_path):
    """CREDIT keeps a file when any year string of the split occurs anywhere in its path."""
    out = tmp_path / "run_2001"
    with pytest.raises(GenerateError, match="year filter"):
        generate_credit_gen1(out, **KW)
    assert not out.exists()
