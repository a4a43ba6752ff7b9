"""CreditGen1Dataset against CREDIT's own gen1 dataset and trainer (tests/fixtures/credit_gen1_data,
made once with CREDIT's code: its README says how): for the same times, the model input and
the target equal CREDIT's, in five data configurations."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from credit.data.catalog import DataError
from credit.interop.data_gen1 import CreditGen1Dataset
from credit.models.inputs import credit_input

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "credit_gen1_data"
VARIANTS = ("A", "B", "C", "D", "E")


def _expected(variant: str) -> dict:
    return torch.load(FIXTURE / f"expected_{variant}.pt")


def _dataset(config: dict, split: str, root: Path = FIXTURE / "data", **extra) -> CreditGen1Dataset:
    data = config["data"]
    first, last = data["train_years"] if split == "train" else data["valid_years"]
    files = dict(upper_air=data["save_loc"], surface=data.get("save_loc_surface"),
                 dynamic_forcing=data.get("save_loc_dynamic_forcing"), diagnostic=data.get("save_loc_diagnostic"),
                 forcing=data.get("save_loc_forcing"), static=data.get("save_loc_static"),
                 mean=data["mean_path"], std=data["std_path"])
    kwargs = dict(
        files=files, upper_air=data["variables"], surface=data.get("surface_variables") or [],
        dynamic_forcing=data.get("dynamic_forcing_variables") or [], forcing=data.get("forcing_variables") or [],
        static=data.get("static_variables") or [], diagnostic=data.get("diagnostic_variables") or [],
        levels=[500.0, 700.0, 850.0], period=(f"{first}-01-01", f"{last - 1}-12-31"),  # end exclusive
        history_len=data["history_len"], forecast_len=data["forecast_len"] + 1,
        skip_periods=data.get("skip_periods") or 1, static_first=data.get("static_first", True))
    return CreditGen1Dataset(root, **{**kwargs, **extra})


def _ns(iso: str) -> int:
    return int(np.datetime64(iso, "ns").astype(np.int64))


@pytest.mark.parametrize("variant", VARIANTS)
def test_model_input_and_target_equal_credits(variant):
    expected = _expected(variant)
    checked = 0
    for split in ("train", "valid"):
        ds = _dataset(expected["config"], split)
        by_first_input = {int(ds.sample_times(i)[0][0]): i for i in range(len(ds))}
        for index, record in expected["samples"][split].items():
            sample = ds[by_first_input[_ns(record["input_times"][0][0])]]
            inputs, targets = ds.sample_times(int(sample["index"]))
            assert inputs.tolist() == [_ns(t) for t in record["input_times"][0]], (split, index)
            frames = inputs.shape[0]
            for step, (x_block, y) in enumerate(zip(record["model_x_forcing_static_per_step"],
                                                    record["model_y_per_step"])):
                if step and targets[step] != _ns(record["target_times"][step][0]):
                    continue  # CREDIT's clamp repeats a step or jumps to the next year's file here
                assert targets[step] == _ns(record["target_times"][step][0]), (split, index, step)
                torch.testing.assert_close(sample["target"][step][None, :, None], y, rtol=1e-6, atol=0)
                block = sample["forcing"][step: step + frames]
                if x_block is None:
                    assert block.shape[1] == 0
                else:
                    torch.testing.assert_close(block.transpose(0, 1)[None], x_block, rtol=1e-6, atol=0)
                checked += 1
            x = credit_input(sample["state"][None], sample["forcing"][None, :frames], sample["static"][None])
            # an error bound: each run normalises with a subtraction and a division (2 roundings,
            # 2.4e-7 apart at most); bitwise on the AVX2, scalar and MKL CNR paths
            torch.testing.assert_close(x, record["model_x"], rtol=1e-6, atol=0)
            torch.testing.assert_close(sample["target"][0][None, :, None], record["model_y"], rtol=1e-6, atol=0)
    assert checked >= 7


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_start_once_and_never_across_a_year_file(variant):
    """CREDIT's index space holds one more index per file (a duplicate of its last start)."""
    expected = _expected(variant)
    for split, credit_len, files in (("train", expected["len_train"], expected["train_files"]),
                                     ("valid", expected["len_valid"], expected["valid_files"])):
        ds = _dataset(expected["config"], split)
        assert len(ds) == credit_len - len(files)
        for i in range(len(ds)):
            inputs, targets = ds.sample_times(i)
            years = {str(t.astype("datetime64[ns]"))[:4] for t in np.append(inputs, targets)}
            assert len(years) == 1


def test_channel_names_follow_credits_order():
    for variant in ("A", "B", "E"):
        expected = _expected(variant)
        ds = _dataset(expected["config"], "train")
        names = ds.state_channel_names + ds.forcing_channel_names
        assert names == expected["channels_in"]
        assert ds.target_channel_names == expected["channels_out"]


def test_clamp_bounds_inputs_and_targets():
    expected = _expected("A")
    ds = _dataset(expected["config"], "train", clamp=(-0.5, 0.5))
    sample = ds[3]
    for key in ("state", "forcing", "target"):
        assert sample[key].min() >= -0.5 and sample[key].max() <= 0.5
        assert (sample[key].abs() == 0.5).any()


def test_mismatches_name_the_file_and_the_key(tmp_path):
    expected = _expected("A")
    with pytest.raises(DataError, match=r"data.levels \[500.0, 850.0\] differ from the level coordinate"):
        _dataset(expected["config"], "train", levels=[500.0, 850.0])
    with pytest.raises(DataError, match="no file name holds a year in 1990-1991"):
        _dataset(expected["config"], "train", period=("1990-01-01", "1991-12-31"))
    with pytest.raises(DataError, match="has no variable 'W'"):
        _dataset(expected["config"], "train", upper_air=["U", "W"])
    with pytest.raises(DataError, match="skip_periods > 1 with forecast_len > 0"):
        _dataset(expected["config"], "train", skip_periods=2, forecast_len=2)
    root = tmp_path / "data"
    shutil.copytree(FIXTURE / "data", root)
    (root / "era5_2001.nc").rename(root / "era5_2001_copy.nc")
    shutil.copy(root / "era5_2001_copy.nc", root / "surface_2001.nc")
    (root / "era5_2001_copy.nc").rename(root / "era5_2001.nc")
    with pytest.raises(DataError, match="hold different years"):
        _dataset(expected["config"], "train", root=root,
                 files=dict(upper_air="era5_*.nc", surface="era5_2000.nc", dynamic_forcing="era5_*.nc",
                            diagnostic="era5_*.nc", forcing="forcing.nc", static="static.nc", mean="mean.nc",
                            std="std.nc"))


def _fixture_copy(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(FIXTURE / "data", root)
    return root


def test_a_zero_or_missing_std_is_one_error_naming_the_file_variable_and_level(tmp_path):
    """A std of 0 would divide every value of that channel into inf or NaN: a NaN loss at step 1."""
    import xarray as xr

    expected = _expected("A")
    for var, level, value, match in [("T", 1, 0.0, r"std of 'T' at level 700 is 0\.0; it must be finite and > 0"),
                                     ("SP", None, np.nan, r"std of 'SP' is nan; it must be finite and > 0")]:
        root = _fixture_copy(tmp_path / var)
        with xr.open_dataset(root / "std.nc") as ds:
            std = ds.load()
        if level is None:
            std[var] = std[var].copy(data=value)
        else:
            std[var][level] = value
        std.to_netcdf(root / "std.nc")
        with pytest.raises(DataError, match=str(root / "std.nc").replace(".", r"\.") + ": the " + match):
            _dataset(expected["config"], "train", root=root)


def test_a_static_file_on_another_grid_is_one_error_before_any_sample(tmp_path):
    import xarray as xr

    expected = _expected("A")
    root = _fixture_copy(tmp_path)
    with xr.open_dataset(root / "static.nc") as ds:
        coarse = ds.load().isel(latitude=slice(0, 8), longitude=slice(0, 8))
    coarse.to_netcdf(root / "static.nc")
    with pytest.raises(DataError, match=r"static\.nc: static variable 'Z_GDS4_SFC' has shape \(8, 8\), not the "
                                        r"data's grid \(9, 16\)"):
        _dataset(expected["config"], "train", root=root)


def test_a_nan_in_a_data_file_is_one_error_naming_file_variable_time_and_level(tmp_path):
    import xarray as xr

    expected = _expected("A")
    root = _fixture_copy(tmp_path)
    with xr.open_dataset(root / "era5_2000.nc") as ds:
        data = ds.load()
    data["T"][0, 2, 1, 1] = np.nan  # the first time, the third level
    data.to_netcdf(root / "era5_2000.nc")
    first = str(data.time.values[0].astype("datetime64[s]"))
    dataset = _dataset(expected["config"], "train", root=root)
    with pytest.raises(DataError, match=rf"1 non-finite values \(NaN first\) in 'T' of .*era5_2000\.nc at time "
                                        rf"{first}, level 850; CREDIT's layouts are read as they are"):
        dataset[0]


def test_a_nan_in_a_static_field_is_one_error_before_any_sample(tmp_path):
    import xarray as xr

    expected = _expected("A")
    root = _fixture_copy(tmp_path)
    with xr.open_dataset(root / "static.nc") as ds:
        static = ds.load()
    static["Z_GDS4_SFC"].values[2, 3] = np.nan
    static.to_netcdf(root / "static.nc")
    with pytest.raises(DataError, match=r"1 non-finite values \(NaN first\) in 'Z_GDS4_SFC' of .*static\.nc; CREDIT's"):
        _dataset(expected["config"], "train", root=root)


def test_uneven_times_in_a_file_are_one_warning_naming_it(tmp_path, caplog):
    """CREDIT's gen1 reader pairs time steps by position, as this one does: a gap reads on, and
    says where it is."""
    import xarray as xr

    expected = _expected("A")
    root = _fixture_copy(tmp_path)
    with xr.open_dataset(root / "era5_2000.nc") as ds:
        data = ds.load()
    data.isel(time=[i for i in range(data.sizes["time"]) if i != 3]).to_netcdf(root / "era5_2000.nc")
    after = str(data.time.values[2].astype("datetime64[m]"))
    with caplog.at_level("WARNING"):
        _dataset(expected["config"], "train", root=root)
    assert [r.getMessage() for r in caplog.records if "not evenly spaced" in r.getMessage()] == [
        f"{root / 'era5_2000.nc'}: its times are not evenly spaced (12 h after {after}, 6 h elsewhere); CREDIT's gen1 "
        "reader pairs time steps by position, and so does this run: a sample across it spans other intervals than "
        "the rest"]


def test_a_fresh_process_unpickles_the_dataset_as_a_spawned_loader_worker_does(tmp_path):
    """A DataLoader worker started by spawn or forkserver (Python 3.14's default on Linux)
    unpickles the dataset in a process that has imported nothing: `credit.interop` first."""
    ds = _dataset(_expected("A")["config"], "train")
    pickled = tmp_path / "dataset.pkl"
    pickled.write_bytes(pickle.dumps(ds))
    code = ("import pickle, sys; ds = pickle.loads(open(sys.argv[1], 'rb').read()); "
            "print(len(ds), tuple(ds[0]['state'].shape))")
    result = subprocess.run([sys.executable, "-c", code, str(pickled)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[0] == str(len(ds)) and str(tuple(ds[0]["state"].shape)) in result.stdout
