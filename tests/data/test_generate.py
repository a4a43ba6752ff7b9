"""Synthetic generator: determinism, ERA5 layout and CF attributes, statistics, physical sanity, CLI."""

from __future__ import annotations

import netCDF4
import numpy as np
import pytest
import xarray as xr
from datahelpers import GRID, LEVELS

from credit.data import generate_dataset
from credit.data.generate import GenerateError
from credit.data.generate_command import main
from credit.data.physics import solar_geometry, toa_irradiance


PROGNOSTIC = ("U", "V", "T", "Q", "SP", "t2m")
FILES = ("era5_2000.nc", "era5_2001.nc", "forcing_2000.nc", "forcing_2001.nc", "static.nc", "mean.nc", "std.nc")


def _load(path):
    with xr.open_dataset(path) as ds:
        return ds.load()


def test_same_arguments_give_identical_arrays_and_seed_matters(tmp_path):
    kw = dict(grid=(6, 12), years=(2000,), levels=(850,), days_per_year=1, progress=False)
    a = generate_dataset(tmp_path / "a", seed=1, **kw)
    b = generate_dataset(tmp_path / "b", seed=1, **kw)
    c = generate_dataset(tmp_path / "c", seed=2, **kw)
    for name in ("era5_2000.nc", "forcing_2000.nc", "static.nc", "mean.nc", "std.nc"):
        da, db = _load(a / name), _load(b / name)
        for var in da.data_vars:
            assert np.array_equal(da[var].values, db[var].values), (name, var)
    assert not np.array_equal(_load(a / "static.nc")["LSM"].values, _load(c / "static.nc")["LSM"].values)
    assert not np.array_equal(_load(a / "era5_2000.nc")["V"].values, _load(c / "era5_2000.nc")["V"].values)


def test_layout_coordinates_and_cf_attributes(small_root):
    assert sorted(p.name for p in small_root.iterdir()) == sorted(FILES)
    era5 = _load(small_root / "era5_2000.nc")
    assert era5.attrs["Conventions"] == "CF-1.8"
    for var in ("U", "V", "T", "Q"):
        assert era5[var].dims == ("time", "level", "latitude", "longitude")
    for var in ("SP", "t2m"):
        assert era5[var].dims == ("time", "latitude", "longitude")
    units = {"U": "m s-1", "V": "m s-1", "T": "K", "Q": "kg kg-1", "SP": "Pa", "t2m": "K"}
    for var, unit in units.items():
        assert era5[var].dtype == np.float32
        assert era5[var].attrs["units"] == unit and era5[var].attrs["long_name"]
    assert era5["U"].attrs["standard_name"] == "eastward_wind"
    assert era5["SP"].attrs["standard_name"] == "surface_air_pressure"
    lat, lon = era5["latitude"].values, era5["longitude"].values
    assert lat.shape == (GRID[0],) and lat[0] == 90.0 and lat[-1] == -90.0 and np.all(np.diff(lat) < 0)
    assert lon.shape == (GRID[1],) and lon[0] == 0.0 and lon[-1] < 360.0 and np.all(np.diff(lon) > 0)
    assert era5["latitude"].attrs["units"] == "degrees_north"
    assert list(era5["level"].values) == list(LEVELS) and era5["level"].attrs["units"] == "hPa"
    steps = np.diff(era5["time"].values)
    assert len(era5["time"]) == 8 and np.all(steps == np.timedelta64(6, "h"))
    with netCDF4.Dataset(small_root / "era5_2000.nc") as raw:  # time is CF-encoded on disk
        assert raw["time"].units.startswith("hours since") and raw["time"].calendar
    forcing = _load(small_root / "forcing_2000.nc")
    assert forcing["tsi"].dims == ("time", "latitude", "longitude") and forcing["tsi"].attrs["units"] == "W m-2"
    static = _load(small_root / "static.nc")
    assert static["Z_GDS4_SFC"].attrs["units"] == "m2 s-2" and static["LSM"].dims == ("latitude", "longitude")


def test_statistics_come_from_training_years_only(small_root):
    mean, std = _load(small_root / "mean.nc"), _load(small_root / "std.nc")
    assert list(np.atleast_1d(mean.attrs["train_years"])) == [2000]
    train, test = _load(small_root / "era5_2000.nc"), _load(small_root / "era5_2001.nc")
    for var in ("U", "T", "Q"):
        expected = train[var].astype(np.float64).mean(("time", "latitude", "longitude")).values
        np.testing.assert_allclose(mean[var].values, expected, rtol=1e-5)
        np.testing.assert_allclose(std[var].values, train[var].astype(np.float64).std(
            ("time", "latitude", "longitude")).values, rtol=1e-5)
        assert mean[var].dims == ("level",)
    both = xr.concat([train["T"], test["T"]], "time").astype(np.float64).mean(("time", "latitude", "longitude"))
    assert not np.allclose(mean["T"].values, both.values, rtol=1e-6)
    np.testing.assert_allclose(float(mean["SP"]), float(train["SP"].astype(np.float64).mean()), rtol=1e-6)
    assert mean["SP"].dims == () and mean["tsi"].dims == () and mean["LSM"].dims == ()
    tsi = _load(small_root / "forcing_2000.nc")["tsi"].astype(np.float64)
    np.testing.assert_allclose(float(std["tsi"]), float(tsi.std()), rtol=1e-5)


def test_physical_magnitudes_and_six_hour_changes(small_root):
    ds = xr.concat([_load(small_root / "era5_2000.nc"), _load(small_root / "era5_2001.nc")], "time")
    assert 10.0 < float(ds["U"].max()) < 90.0 and float(ds["V"].std()) > 2.0  # a jet and real waves
    assert 180.0 < float(ds["T"].min()) and float(ds["T"].max()) < 320.0
    assert 0.0 <= float(ds["Q"].min()) and 1e-3 < float(ds["Q"].max()) < 0.03
    assert 5e4 < float(ds["SP"].min()) and float(ds["SP"].max()) < 1.1e5
    assert 200.0 < float(ds["t2m"].min()) and float(ds["t2m"].max()) < 330.0
    # Persistence is clearly imperfect after 6 h for every prognostic variable.
    floor = {"U": 0.3, "V": 0.3, "T": 0.1, "Q": 5e-6, "SP": 20.0, "t2m": 0.5}
    for year in (2000, 2001):
        one = _load(small_root / f"era5_{year}.nc")
        for var in PROGNOSTIC:
            x = one[var].values.astype(np.float64)
            rmse = np.sqrt(np.mean((x[1:] - x[:-1]) ** 2))
            assert rmse > floor[var], (year, var, rmse)


def test_static_fields_and_orographic_pressure(small_root):
    static = _load(small_root / "static.nc")
    lsm, z = static["LSM"].values, static["Z_GDS4_SFC"].values
    assert set(np.unique(lsm)) == {0.0, 1.0} and 0.1 < lsm.mean() < 0.6
    assert np.all(z[lsm == 0] == 0) and np.all(z[lsm == 1] > 0) and z.max() / 9.81 < 6000
    sp = _load(small_root / "era5_2000.nc")["SP"].mean("time").values
    # Pressure drops over mountains: compare departures from the zonal means.
    anomaly_sp, anomaly_z = sp - sp.mean(1, keepdims=True), z - z.mean(1, keepdims=True)
    assert np.corrcoef(anomaly_sp.ravel(), anomaly_z.ravel())[0, 1] < -0.7
    t2m = _load(small_root / "era5_2000.nc")["t2m"].values
    swing = t2m.max(0) - t2m.min(0)
    assert swing[lsm == 1].mean() > 1.5 * swing[lsm == 0].mean()  # land-amplified diurnal cycle


def test_tsi_night_side_zero_and_peak_at_subsolar_point(small_root):
    forcing = _load(small_root / "forcing_2000.nc")
    lat, lon = forcing["latitude"].values, forcing["longitude"].values
    for k, t in enumerate(forcing["time"].values):
        ns = int(t.astype("datetime64[ns]").astype(np.int64))
        tsi = forcing["tsi"].values[k]
        np.testing.assert_allclose(tsi, toa_irradiance(ns, lat, lon), rtol=1e-6, atol=1e-3)
        dec, dist, hour = solar_geometry(ns)
        phi, h = np.deg2rad(lat)[:, None], np.deg2rad(15.0 * (hour - 12.0) + lon)[None, :]
        cos_zen = np.sin(phi) * np.sin(dec) + np.cos(phi) * np.cos(dec) * np.cos(h)
        assert np.all(tsi[cos_zen < 0] == 0) and np.all(tsi[cos_zen > 0.05] > 0)
    # On a fine grid the maximum sits at the subsolar point (January: southern tropics).
    fine_lat, fine_lon = np.linspace(90, -90, 361), np.arange(720) * 0.5
    ns = int(np.datetime64("2000-01-01T12:00", "ns").astype(np.int64))
    tsi = toa_irradiance(ns, fine_lat, fine_lon)
    i, j = np.unravel_index(np.argmax(tsi), tsi.shape)
    dec = np.rad2deg(solar_geometry(ns)[0])
    assert abs(fine_lat[i] - dec) <= 0.5 and min(fine_lon[j], 360 - fine_lon[j]) <= 0.5
    assert -23.5 < dec < -22.0 and 1361 * 1.03 < tsi.max() < 1361 * 1.04  # perihelion in January


def test_cli_errors_are_one_line_and_nonzero(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "x"), "--grid", "32by64"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--grid" in err and "32by64" in err
    assert main(["--out", str(tmp_path / "x"), "--years", "2000", "--train-years", "1999"]) != 0
    assert "train_years" in capsys.readouterr().err
    out = tmp_path / "cli"
    args = ["--out", str(out), "--grid", "4x8", "--years", "2000", "--levels", "850",
            "--days-per-year", "1", "--no-progress"]
    assert main(args) == 0 and (out / "era5_2000.nc").exists()
    assert main(args) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not empty" in err[0] and "--overwrite" in err[0]
    (out / "notes.txt").write_text("keep me")
    assert main(args + ["--overwrite"]) == 0 and (out / "notes.txt").exists()
    with pytest.raises(GenerateError, match="levels"):
        generate_dataset(tmp_path / "y", levels=(), progress=False)
    assert main(["--out", str(tmp_path / "z"), "--format", "grib"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--format" in err and "grib" in err
    # --overwrite replaces one format's files by the other's, leaving no stale store behind
    assert main(args + ["--overwrite", "--format", "zarr"]) == 0
    assert (out / "era5_2000.zarr").is_dir() and not (out / "era5_2000.nc").exists()
    assert (out / "mean.nc").exists() and (out / "notes.txt").exists()
    assert "data.files.upper_air='era5_*.zarr'" in capsys.readouterr().out


def test_zarr_stores_hold_the_netcdf_values_one_time_per_chunk(small_root, small_zarr_root):
    for name in ("era5_2000", "forcing_2001", "static"):
        nc, zr = _load(small_root / f"{name}.nc"), _load(small_zarr_root / f"{name}.zarr")
        assert nc.identical(zr.assign_attrs(nc.attrs)), name
    with xr.open_dataset(small_zarr_root / "era5_2000.zarr", engine="zarr") as ds:
        assert ds["T"].encoding["chunks"] == (1, len(LEVELS), *GRID)
    with netCDF4.Dataset(small_root / "era5_2000.nc") as ds:
        assert ds["T"].chunking() == [1, len(LEVELS), *GRID]
    assert (small_zarr_root / "era5_2000.zarr" / ".zmetadata").exists()  # consolidated: one read opens it


def test_every_level_stays_statistically_steady_over_a_year(tmp_path):
    """No variable may dry out or drift away at any level: a year-long run keeps each
    level's spatial mean and 6-hour variability of the last month within a factor of 2 of
    the first month's (upper-level humidity once decayed to zero without a source)."""
    root = generate_dataset(tmp_path / "year", grid=(8, 16), years=[2000], levels=[300, 850],
                            progress=False)
    ds = xr.open_dataset(root / "era5_2000.nc")
    first = ds.sel(time=slice("2000-01-01", "2000-01-31"))
    last = ds.sel(time=slice("2000-12-01", "2000-12-31"))
    for name in ("U", "V", "T", "Q"):
        for level in (300, 850):
            a = first[name].sel(level=level).values.astype(np.float64)
            b = last[name].sel(level=level).values.astype(np.float64)
            change_a = np.sqrt(np.mean(np.diff(a, axis=0) ** 2))
            change_b = np.sqrt(np.mean(np.diff(b, axis=0) ** 2))
            assert 0.5 < change_b / change_a < 2.0, (name, level, change_a, change_b)
            if name in ("T", "Q"):
                assert 0.5 < b.mean() / a.mean() < 2.0, (name, level, a.mean(), b.mean())
