"""CreditGen2Dataset against CREDIT's own gen2 dataset and preblocks (tests/fixtures/credit_gen2_data,
made once with CREDIT's MultiSourceDataset, era5_normalizer and concat: its README says how).
The CREDIT config of each variant goes through the mapping table and hydra composition, as
`credit train --credit-config` takes it; for the same init time the model input of every
forecast step, the targets and the forcing equal CREDIT's."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xarray as xr

from credit.config import compose_config
from credit.interop.config_file import map_credit_file
from credit.data.catalog import DataError
from credit.interop.path_templates import template_files
from credit.data.from_config import build_dataset
from credit.models.inputs import credit_input

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "credit_gen2_data"
VARIANTS = ("A", "B", "C")


def _expected(variant: str) -> dict:
    return torch.load(FIXTURE / f"expected_{variant}.pt")


def _placed(value: Any, root: Path) -> Any:
    """The fixture's config with its `DATA/` paths under `root`."""
    if isinstance(value, dict):
        return {k: _placed(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [_placed(v, root) for v in value]
    return value.replace("DATA/", f"{root}/") if isinstance(value, str) else value


def _datasets(config: dict, root: Path = FIXTURE / "data", *extra: str):
    mapping = map_credit_file(_placed(config, root))
    assert mapping.refused == []
    cfg = compose_config([*mapping.overrides, *extra])
    assert cfg.data.layout == "credit-gen2"
    return build_dataset(cfg.data, "train_period"), build_dataset(cfg.data, "valid_period")


def _fixture_copy(tmp_path: Path) -> Path:
    """A copy of the fixture's data to damage."""
    data = tmp_path / "data"
    shutil.copytree(FIXTURE / "data", data)
    return data


def _ns(iso: str) -> int:
    return int(np.datetime64(iso, "ns").astype(np.int64))


@pytest.mark.parametrize("variant", VARIANTS)
def test_init_times_and_channels_are_credits(variant):
    expected = _expected(variant)
    train, valid = _datasets(expected["config"])
    for ds, inits in ((train, expected["train_inits"]), (valid, expected["valid_inits"])):
        assert [int(ds.sample_times(i)[0][-1]) for i in range(len(ds))] == [_ns(t) for t in inits]
    assert train.levels == [float(v) for v in expected["levels"]]
    assert train.state_channel_names + train.forcing_channel_names == expected["channels_in"]
    assert train.target_channel_names == expected["channels_out"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_steps_input_targets_and_forcing_equal_credits(variant):
    """Step i's input is what CREDIT's gen2 trainer assembles with a perfect prediction (the
    fixture's `x_steps`): the newest `history_len` state frames, each with its static and
    forcing fields, exactly as `credit.train.forecast` feeds the model. Equal bit for bit: the
    normalisation is +-*/ in CREDIT's order, correctly rounded on any CPU (bitwise on the AVX2,
    scalar and MKL CNR paths)."""
    expected = _expected(variant)
    checked = 0
    for split, ds in zip(("train", "valid"), _datasets(expected["config"])):
        index_of = {int(ds.sample_times(i)[0][-1]): i for i in range(len(ds))}
        for index, record in expected["samples"][split].items():
            sample = ds[index_of[_ns(record["init"])]]
            frames, state_channels = ds.history_len, sample["state"].shape[1]
            states = torch.cat([sample["state"], sample["target"][:, :state_channels]])
            x = credit_input(sample["state"][None], sample["forcing"][None, :frames], sample["static"][None])
            torch.testing.assert_close(x, record["x0"], rtol=0, atol=0)
            for step, (x_step, y) in enumerate(zip(record["x_steps"], record["y"])):
                window = states[step: step + frames][None]
                x = credit_input(window, sample["forcing"][None, step: step + frames], sample["static"][None])
                torch.testing.assert_close(x, x_step, rtol=0, atol=0)
                torch.testing.assert_close(sample["target"][step][None, :, None], y, rtol=0, atol=0)
                tsi = sample["forcing"][frames - 1 + step, -1]
                torch.testing.assert_close(tsi, record["forcing"][step]["tsi"][0, 0, -1], rtol=0, atol=0)
                checked += 1
    assert checked >= 7


def test_the_normalisers_float32_arithmetic_and_pass_through():
    """Z_GDS4_SFC has no statistics: it passes through as stored; LSM is z-scored in float32."""
    expected = _expected("A")
    train, _ = _datasets(expected["config"])
    forcing = train[0]["forcing"][0]
    with xr.open_dataset(FIXTURE / "data" / "static.nc") as static, \
            xr.open_dataset(FIXTURE / "data" / "mean.nc") as mean, xr.open_dataset(FIXTURE / "data" / "std.nc") as std:
        z = static["Z_GDS4_SFC"].values.astype(np.float32)
        lsm = static["LSM"].values.astype(np.float32)
        m, s = np.float32(mean["LSM"].values), np.float32(std["LSM"].values)
    assert torch.equal(forcing[0], torch.from_numpy(z))
    assert torch.equal(forcing[1], torch.from_numpy((lsm - m) / s))


def test_template_files_date_each_file_by_its_name(tmp_path):
    for name in ("ERA5_all_2000_a.nc", "ERA5_all_2001_a.nc", "notes.txt"):
        (tmp_path / name).touch()
    spans = template_files(tmp_path, "ERA5_all_%Y*.nc")
    assert [p.name for p, _, _ in spans] == ["ERA5_all_2000_a.nc", "ERA5_all_2001_a.nc"]
    assert spans[1][1] == _ns("2001-01-01") and spans[0][2] < spans[1][1] <= spans[0][2] + 1000
    only = template_files(tmp_path, "ERA5_all_2000_a.nc")
    assert len(only) == 1 and only[0][1] < _ns("1900-01-01") and only[0][2] > _ns("2100-01-01")


def test_bad_files_fail_with_one_line_naming_them(tmp_path):
    expected = _expected("A")
    data = _fixture_copy(tmp_path)
    with xr.open_dataset(FIXTURE / "data" / "mean.nc") as mean:  # statistics on four levels
        mean.isel(level=slice(0, 4)).load().to_netcdf(data / "mean.nc")
    config = _placed(expected["config"], data)
    config["preblocks"]["per_step"]["norm"]["args"].pop("levels")
    with pytest.raises(DataError, match="mean.nc: U has 4 levels, the data 3"):
        _datasets(config, data)
    (data / "ERA5_all_2001.nc").unlink()
    config = _placed(_expected("B")["config"], data)
    with pytest.raises(DataError, match=r"ERA5_all_2000\.nc lacks \d+ of the \d+ times the samples read, the first "
                                        r"2001-"):  # one file serves every time: before any sample
        _datasets(config, data, "data.credit.files.mean=" + str(FIXTURE / "data" / "mean.nc"))


@pytest.mark.parametrize("damage", ["gap", "not dates"])
def test_a_time_no_file_holds_is_one_error_before_any_sample(tmp_path, damage):
    """CREDIT reads every sample time exactly: a file with a gap, or whose time coordinate is not
    dates, is one line naming it, the times it lacks and those it holds, at the dataset's start."""
    expected = _expected("A")
    data = _fixture_copy(tmp_path)
    with xr.open_dataset(FIXTURE / "data" / "ERA5_all_2000.nc") as ds:
        values = ds.load()
    if damage == "gap":
        values = values.isel(time=[i for i in range(values.sizes["time"]) if i != 2])
        message = r"ERA5_all_2000\.nc lacks 1 of the \d+ times the samples read, the first 2000-.*; it holds"
    else:
        values = values.assign_coords(time=np.arange(values.sizes["time"]))
        message = r"ERA5_all_2000\.nc lacks .* \(its time coordinate holds int64 values, not dates\)"
    values.to_netcdf(data / "ERA5_all_2000.nc")
    with pytest.raises(DataError, match=message):
        _datasets(_placed(expected["config"], data), data)


def test_a_static_store_on_another_grid_is_one_error_before_any_sample(tmp_path):
    expected = _expected("A")
    data = _fixture_copy(tmp_path)
    with xr.open_dataset(FIXTURE / "data" / "static.nc") as static:
        lat, lon = (d for d in static.dims if d != "time")
        static.isel({lat: slice(0, 2)}).load().to_netcdf(data / "static.nc")
    with pytest.raises(DataError, match=r"static\.nc: static variable '\w+' has shape \(.*\), not the data's grid"):
        _datasets(_placed(expected["config"], data), data)


def test_a_nan_read_is_one_error_naming_file_variable_and_time(tmp_path):
    """A missing zarr chunk reads as its fill value, NaN: the same error, not a NaN loss."""
    expected = _expected("A")
    data = _fixture_copy(tmp_path)
    with xr.open_dataset(FIXTURE / "data" / "ERA5_all_2000.nc") as ds:
        values = ds.load()
    var = next(v for v in values.data_vars if values[v].ndim == 3 and "time" in values[v].dims)
    values[var][:] = np.nan
    values.to_netcdf(data / "ERA5_all_2000.nc")
    train, _ = _datasets(_placed(expected["config"], data), data)
    with pytest.raises(DataError, match=rf"non-finite values \(NaN first\) in '{var}' of .*ERA5_all_2000\.nc at "
                                        rf"time 2000-"):
        train[0]


def test_a_nan_in_a_static_field_is_one_error_before_any_sample(tmp_path):
    expected = _expected("A")
    data = _fixture_copy(tmp_path)
    with xr.open_dataset(FIXTURE / "data" / "static.nc") as ds:
        values = ds.load()
    var = expected["config"]["data"]["source"]["ERA5"]["variables"]["static"]["vars_2D"][0]
    values[var].values[..., 1, 2] = np.nan
    values.to_netcdf(data / "static.nc")
    with pytest.raises(DataError, match=rf"1 non-finite values \(NaN first\) in '{var}' of .*static\.nc"):
        _datasets(_placed(expected["config"], data), data)


def test_a_zero_std_is_one_error_naming_the_file_and_variable(tmp_path):
    """CREDIT's normaliser divides by max(std, 1e-12): a zero std of a dynamic variable would
    make values near 1e12 and a loss that overflows; one error names it before any sample.
    A static's (a constant field's) zero std stays CREDIT's: its values minus the mean are 0."""
    expected = _expected("A")
    data = _fixture_copy(tmp_path)
    with xr.open_dataset(FIXTURE / "data" / "std.nc") as std:
        values = std.load()
    values["SP"][...] = 0.0
    values.to_netcdf(data / "std.nc")
    with pytest.raises(DataError, match=r"std\.nc: the std of 'SP' is 0\.0 .*must be finite and > 0"):
        _datasets(_placed(expected["config"], data), data)
