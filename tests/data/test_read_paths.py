"""The read paths of ERA5Dataset give the same samples on every netCDF and zarr layout.

Plain float32 netCDF-4 variables are read by h5py straight into the sample, and plain zarr
v2 chunks are decoded straight into it; anything xarray decodes (packing, fill values, other
dtypes, transposed dims, netCDF-3, split chunks, zarr v3) goes through xarray.
Each variant below rewrites the generated yearly files one way and must give the samples of
the original files bit for bit; the packed and fill-value variants fail if a decoded
variable is taken for a plain one.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import xarray as xr
from datahelpers import FILES, SPEC, ZARR_FILES

from credit.data import DataError, ERA5Dataset
from credit.data.integrity import NonFiniteData
from credit.data.zarr_direct import ZarrChunks

LEVELS_REQ = (850, 500)  # not the file order: the direct path reads level by level
DATA_FILES = ("era5_2000.nc", "forcing_2000.nc")


def _dataset(root, files=FILES, **kw) -> ERA5Dataset:
    return ERA5Dataset(root, files=files, variables=SPEC, levels=LEVELS_REQ, period=("2000-01-01", "2000-01-02"),
                       history_len=2, forecast_len=1, **kw)


def _rewrite(src, dst, how: str) -> None:
    shutil.copytree(src, dst)
    for name in DATA_FILES:
        with xr.open_dataset(src / name) as ds:
            ds = ds.load()
        encoding, kwargs = {}, {}
        names = list(ds.data_vars)
        if how == "packed":  # power-of-two packing: decoding restores the values exactly
            ds = ds.copy()
            encoding = {v: {"dtype": "float32", "scale_factor": 2.0, "add_offset": 0.0} for v in names}
        elif how == "fill":
            encoding = {v: {"_FillValue": np.float32(-9999.0)} for v in names}
        elif how == "float64":
            ds = ds.astype(np.float64)
        elif how == "transposed":  # longitude before latitude, levels last
            ds = ds.transpose("time", "longitude", "latitude", ...)
        elif how == "netcdf3":
            kwargs = {"format": "NETCDF3_64BIT"}
        elif how == "compressed":  # chunked and deflated: still read directly, h5py inflates
            encoding = {v: {"zlib": True, "shuffle": True, "complevel": 1,
                            "chunksizes": (1,) + ds[v].shape[1:]} for v in names}
        elif how == "levels_descending":
            ds = ds.isel(level=slice(None, None, -1)) if "level" in ds.dims else ds
        else:
            raise AssertionError(how)
        (dst / name).unlink()
        ds.to_netcdf(dst / name, encoding=encoding, **kwargs)


def _assert_same_samples(original: ERA5Dataset, variant: ERA5Dataset, how: str) -> None:
    assert len(variant) == len(original) == 6
    for i in range(len(original)):
        want, got = original[i], variant[i]
        for key in ("state", "forcing", "static", "target", "time"):
            assert np.array_equal(got[key].numpy(), want[key].numpy()), (how, i, key)


@pytest.mark.parametrize("how", ["packed", "fill", "float64", "transposed", "netcdf3", "compressed",
                                 "levels_descending"])
def test_every_layout_reads_the_same_samples(small_root, tmp_path, how):
    original = _dataset(small_root)
    _rewrite(small_root, tmp_path / how, how)
    variant = _dataset(tmp_path / how)
    _assert_same_samples(original, variant, how)


def test_a_fill_value_in_the_file_is_read_as_missing(small_root, tmp_path):
    """A stored _FillValue decodes to NaN (the sample is refused, naming the file), never to
    -9999 passed on as a temperature."""
    root = tmp_path / "filled"
    shutil.copytree(small_root, root)
    with xr.open_dataset(small_root / "era5_2000.nc") as ds:
        ds = ds.load()
    ds["T"][2, 0, 3, 4] = np.nan  # written as -9999 below
    (root / "era5_2000.nc").unlink()
    ds.to_netcdf(root / "era5_2000.nc", encoding={v: {"_FillValue": np.float32(-9999.0)} for v in ds.data_vars})
    with xr.open_dataset(root / "era5_2000.nc", mask_and_scale=False) as raw:
        assert float(raw["T"][2, 0, 3, 4]) == -9999.0  # the file holds the fill value itself
    ds = _dataset(root)
    with pytest.raises(NonFiniteData, match=r"'T' of .*era5_2000\.nc at time 2000-01-01T12"):
        ds[0]
    assert np.isfinite(ds[len(ds) - 1]["state"].numpy()).all()  # samples without that time read fine


ZARR_DATA = ("era5_2000.zarr", "forcing_2000.zarr")
ZARR_DIRECT = {"zarr_as_generated": True, "zarr_uncompressed": True, "zarr_zlib": True,
               "zarr_levels_descending": True, "zarr_split_chunks": False, "zarr_fill": False,
               "zarr_packed": False, "zarr_v3": False}


def _rewrite_zarr(src, dst, how: str) -> None:
    shutil.copytree(src, dst)
    if how == "zarr_as_generated":
        return
    import numcodecs

    for name in ZARR_DATA:
        with xr.open_dataset(src / name, engine="zarr") as ds:
            ds = ds.load()
        for var in ds.variables.values():  # the source's codecs are not this variant's
            var.encoding = {}
        names, fmt = list(ds.data_vars), 2
        encoding = {v: {"chunks": (1,) + ds[v].shape[1:]} for v in names}
        if how == "zarr_uncompressed":
            encoding = {v: {**encoding[v], "compressors": None} for v in names}
        elif how == "zarr_zlib":
            encoding = {v: {**encoding[v], "compressors": [numcodecs.Zlib(level=1)]} for v in names}
        elif how == "zarr_levels_descending":
            ds = ds.isel(level=slice(None, None, -1)) if "level" in ds.dims else ds
        elif how == "zarr_split_chunks":  # latitude in two chunks: not one chunk per time step
            encoding = {v: {"chunks": (1,) + ds[v].shape[1:-2] + (ds[v].shape[-2] // 2, ds[v].shape[-1])}
                        for v in names}
        elif how == "zarr_fill":
            encoding = {v: {**encoding[v], "_FillValue": np.float32(-9999.0)} for v in names}
        elif how == "zarr_packed":  # power-of-two packing: decoding restores the values exactly
            encoding = {v: {**encoding[v], "dtype": "float32", "scale_factor": 2.0, "add_offset": 0.0}
                        for v in names}
        elif how == "zarr_v3":
            fmt = 3
        else:
            raise AssertionError(how)
        shutil.rmtree(dst / name)
        ds.to_zarr(dst / name, mode="w", encoding=encoding, zarr_format=fmt, consolidated=fmt == 2)


@pytest.mark.parametrize("how", list(ZARR_DIRECT))
def test_every_zarr_layout_reads_the_same_samples(small_root, small_zarr_root, tmp_path, how):
    original = _dataset(small_root)
    _rewrite_zarr(small_zarr_root, tmp_path / how, how)
    variant = _dataset(tmp_path / how, files=ZARR_FILES)
    store = tmp_path / how / "era5_2000.zarr"
    dims = ("time", "level", "latitude", "longitude")
    assert isinstance(variant._reader.files.direct(store, "U", dims, dims), ZarrChunks) == ZARR_DIRECT[how]
    _assert_same_samples(original, variant, how)


def test_an_absent_zarr_chunk_reads_as_xarray_reads_it(small_zarr_root, tmp_path):
    root = tmp_path / "holey"
    shutil.copytree(small_zarr_root, root)
    (root / "era5_2000.zarr" / "T" / "2.0.0.0").unlink()
    ds = _dataset(root, files=ZARR_FILES)
    times = ds.times[:4].astype(np.int64)
    with xr.open_dataset(root / "era5_2000.zarr", engine="zarr") as raw:
        want = raw["T"].isel(time=slice(0, 4)).sel(level=list(LEVELS_REQ)).values
    assert np.array_equal(ds.read_raw("T", times), want, equal_nan=True)


def test_a_damaged_zarr_chunk_is_named(small_zarr_root, tmp_path):
    root = tmp_path / "damaged"
    shutil.copytree(small_zarr_root, root)
    chunk = root / "era5_2000.zarr" / "T" / "2.0.0.0"
    chunk.write_bytes(chunk.read_bytes()[:40])  # truncated: blosc cannot decode it
    ds = _dataset(root, files=ZARR_FILES)
    with pytest.raises(DataError, match=r"damaged zarr chunk .*T/2\.0\.0\.0 \(variable 'T', time index 2\)"):
        ds[0]
    assert np.isfinite(ds[len(ds) - 1]["state"].numpy()).all()  # samples without that time read fine
