"""Files that look fine and are not: a variable missing from one yearly file, a NaN in a field.
Real netCDF files edited with xarray; the dataset must say what is wrong and where."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest
import xarray as xr
from datahelpers import FILES, SPEC

from credit.data import DataError, ERA5Dataset
from credit.data.integrity import NonFiniteData, missing_zarr_chunk, missing_zarr_rows


def _dataset(root, **kw):
    args = dict(files=FILES, variables=SPEC, levels=(500, 850), period=("2000-01-01", "2000-01-02"),
                history_len=2, forecast_len=1)
    args.update(kw)
    return ERA5Dataset(root, **args)


def _edit(path, change):
    with xr.open_dataset(path) as ds:
        edited = change(ds.load())
    edited.to_netcdf(path)


def test_a_variable_missing_from_one_yearly_file_is_an_error_naming_it(boundary_root, tmp_path, caplog):
    root = tmp_path / "data"
    shutil.copytree(boundary_root, root)
    whole = _dataset(root, period=("2000-12-31", "2001-01-01"))
    _edit(root / "era5_2001.nc", lambda ds: ds.drop_vars("Q"))
    with pytest.raises(DataError) as error:
        _dataset(root, period=("2000-12-31", "2001-01-01"))
    message = str(error.value)
    assert "'Q' (upper_air) is absent from ['era5_2001.nc'] at 4 of 8 times (first 2001-01-01T00:00:00)" in message
    # 6 samples of 3 consecutive times over the 8 times; only 2 remain inside 2000-12-31
    assert f"{len(whole) - 2} samples of the period would be dropped" in message
    assert "data.allow_missing_times=true" in message
    with caplog.at_level(logging.WARNING, logger="credit.data.dataset"):
        partial = _dataset(root, period=("2000-12-31", "2001-01-01"), allow_missing_times=True)
    assert len(partial) == 2
    assert "'Q' (upper_air) is absent from ['era5_2001.nc']" in caplog.text
    assert "allow_missing_times=true: left out" in caplog.text


def test_a_nan_is_named_by_file_variable_time_and_level(small_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(small_root, root)

    def poison(ds):
        ds["T"][3, list(ds.level.values).index(850), 2, 5] = np.nan  # 2000-01-01T18, 850 hPa
        return ds

    _edit(root / "era5_2000.nc", poison)
    ds = _dataset(root)
    clean = [i for i in range(len(ds)) if not 3 in range(i, i + 3)]  # samples not reading time 3
    assert [int(ds[i]["skipped"]) for i in clean] == [0] * len(clean)
    with pytest.raises(NonFiniteData) as error:
        ds[1]  # times 1, 2, 3
    assert str(error.value).startswith(
        f"1 non-finite values (NaN first) in 'T' of {root / 'era5_2000.nc'} at time 2000-01-01T18:00:00, level 850")
    assert "data.nonfinite=skip_sample" in str(error.value)

    skipping = _dataset(root, nonfinite="skip_sample")
    sample = skipping[1]  # 1, 2 and 3 read time 3: sample 4 is the first finite one
    assert int(sample["skipped"]) == 3 and int(sample["index"]) == 4
    assert np.isfinite(sample["state"].numpy()).all()


def test_a_nan_in_a_static_field_cannot_be_skipped(small_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(small_root, root)

    def poison(ds):
        ds["LSM"][1, 1] = np.inf
        return ds

    _edit(root / "static.nc", poison)
    with pytest.raises(DataError, match=rf"1 non-finite values \(inf first\) in 'LSM' of {root / 'static.nc'}; "
                                        r"a static field enters every sample"):
        _dataset(root, nonfinite="skip_sample")[0]


def test_an_unknown_nonfinite_mode_is_refused(small_root):
    with pytest.raises(DataError, match=r"nonfinite='drop'; allowed: \['error', 'skip_sample'\]"):
        _dataset(small_root, nonfinite="drop")


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_missing_zarr_chunk_is_found_by_time_index(tmp_path, zarr_format):
    """zarr reads an absent chunk as fill values; both store formats' chunk files are checked:
    from one listing of the variable's folder, and for one time step's chunks."""
    store = tmp_path / "era5.zarr"
    ds = xr.Dataset({"T": (("time", "level", "latitude", "longitude"), np.ones((5, 2, 4, 6), np.float32))})
    ds.to_zarr(store, zarr_format=zarr_format, encoding={"T": {"chunks": (1, 2, 2, 6)}})
    assert missing_zarr_rows(store, "T") == [] and missing_zarr_chunk(store, "T", 3) is None
    chunk = store / "T" / ("3.0.1.0" if zarr_format == 2 else "c/3/0/1/0")
    chunk.unlink()
    assert missing_zarr_rows(store, "T") == [3]
    assert missing_zarr_chunk(store, "T", 3) == chunk and missing_zarr_chunk(store, "T", 2) is None
