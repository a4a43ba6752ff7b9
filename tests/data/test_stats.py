"""`credit data stats`: statistics equal to numpy's over the training period, in the layout the
dataset reads, from netCDF or zarr, guarded against overwriting, and good to train with."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import netCDF4
import numpy as np
import pytest
from launches import credit_command
import xarray as xr
from datahelpers import LEVELS, ZARR_FILES
from tiny import tiny_overrides

import credit.data.stats as stats
from credit.data.stats import main

REPO = Path(__file__).resolve().parents[2]
PERIOD = ["2000-01-01", "2000-01-02"]
UPPER, FLAT, STATIC = ("U", "V", "T", "Q"), ("SP", "t2m", "tsi"), ("Z_GDS4_SFC", "LSM")


def _copy_without_stats(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for name in ("mean.nc", "std.nc"):
        (dst / name).unlink()
    return dst


def _overrides(root: Path, *extra: str) -> list[str]:
    return [f"data.root={root}", "data.generate_if_missing=false",
            f"data.levels=[{','.join(map(str, LEVELS))}]", f"data.train_period=[{','.join(PERIOD)}]",
            *extra]


def _numpy_reference(root: Path, ext: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every value of the period loaded at once, reduced by numpy in float64."""
    ref = {}
    stop = np.datetime64(PERIOD[1]) + np.timedelta64(1, "D")
    for var in UPPER + FLAT:
        pattern = "forcing_*" if var == "tsi" else "era5_*"
        parts = []
        for path in sorted(root.glob(pattern + ext)):
            with xr.open_dataset(path) as ds:
                da = ds[var].sel(time=slice(PERIOD[0], stop - np.timedelta64(1, "ns"))).load()
            parts.append(da)
        values = xr.concat(parts, "time").values.astype(np.float64)
        axes = (0, 2, 3) if var in UPPER else (0, 1, 2)
        ref[var] = values.mean(axis=axes), values.std(axis=axes)
    with xr.open_dataset(root / f"static{ext}") as ds:
        for var in STATIC:
            values = ds[var].values.astype(np.float64)
            ref[var] = values.mean(), values.std()
    return ref


@pytest.mark.parametrize("chunk_bytes", [4 * 8 * 16 * 2, stats.CHUNK_BYTES])  # 1 time step, all
def test_statistics_equal_numpy_in_float64(small_root, tmp_path, monkeypatch, capsys, chunk_bytes):
    monkeypatch.setattr(stats, "CHUNK_BYTES", chunk_bytes)
    root = _copy_without_stats(small_root, tmp_path / "data")
    assert main(["--no-progress", *_overrides(root)]) == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed and "9 variables over 2000-01-01T00:00:00 to 2000-01-02T18:00:00" in printed
    ref = _numpy_reference(small_root, ".nc")
    with xr.open_dataset(root / "mean.nc") as mean, xr.open_dataset(root / "std.nc") as std:
        for var, (m, s) in ref.items():
            assert mean[var].dtype == np.float64
            np.testing.assert_allclose(mean[var].values, m, rtol=1e-13, atol=0, err_msg=var)
            np.testing.assert_allclose(std[var].values, s, rtol=1e-11, atol=0, err_msg=var)
            if var in UPPER:
                assert mean[var].dims == ("level",) and list(mean["level"].values) == list(LEVELS)
            else:
                assert mean[var].dims == ()
        assert mean["T"].attrs["count"] == 8 * 8 * 16  # times x lat x lon, per level
        assert std.attrs["files"] == "era5_2000.nc forcing_2000.nc static.nc"
        assert std.attrs["period"] == "2000-01-01T00:00:00 to 2000-01-02T18:00:00"
        assert "Chan" in std.attrs["method"]


def test_zarr_gives_the_same_statistics(small_root, small_zarr_root, tmp_path):
    nc = _copy_without_stats(small_root, tmp_path / "nc")
    zr = _copy_without_stats(small_zarr_root, tmp_path / "zarr")
    assert main(["--no-progress", *_overrides(nc)]) == 0
    zarr_files = [f"data.files.{role}={glob}" for role, glob in ZARR_FILES.items()]
    assert main(["--no-progress", *_overrides(zr, *zarr_files)]) == 0
    for name in ("mean.nc", "std.nc"):
        with xr.open_dataset(nc / name) as a, xr.open_dataset(zr / name) as b:
            assert a.drop_attrs().identical(b.drop_attrs())


def test_existing_files_are_kept_without_overwrite(small_root, tmp_path, capsys):
    root = _copy_without_stats(small_root, tmp_path / "data")
    (root / "mean.nc").write_bytes(b"keep me")
    assert main(["--no-progress", *_overrides(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "mean.nc" in err and "--overwrite" in err
    assert (root / "mean.nc").read_bytes() == b"keep me" and not (root / "std.nc").exists()
    assert main(["--no-progress", "--overwrite", *_overrides(root)]) == 0
    with xr.open_dataset(root / "mean.nc") as mean:
        assert mean.attrs["created_by"] == "credit data stats"
    assert sorted(p.name for p in root.iterdir() if p.name.endswith(".tmp")) == []
    assert main(["--no-progress", *_overrides(root, "data.files.mean=mean_*.nc")]) == 2
    assert "data.files.mean='mean_*.nc' is a glob" in capsys.readouterr().err


def test_non_finite_values_are_named_or_left_out(small_root, tmp_path, capsys):
    root = _copy_without_stats(small_root, tmp_path / "data")
    with netCDF4.Dataset(root / "era5_2000.nc", "a") as ds:
        ds["T"][3, 1, 2, 5] = np.nan
    assert main(["--no-progress", *_overrides(root)]) == 2
    err = capsys.readouterr().err
    assert "'T'" in err and "era5_2000.nc" in err and "2000-01-01T18" in err
    assert not (root / "mean.nc").exists()
    assert main(["--no-progress", *_overrides(root, "data.nonfinite=skip_sample")]) == 0
    assert "1 non-finite time steps left out" in capsys.readouterr().out
    with xr.open_dataset(root / "mean.nc") as mean:
        assert mean["T"].attrs["count"] == 7 * 8 * 16 and np.isfinite(mean["T"].values).all()


def test_its_output_trains(tiny_data, tmp_path):
    root = _copy_without_stats(tiny_data, tmp_path / "data")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = tiny_overrides(root, f"run_dir={tmp_path / 'run'}", "trainer.max_steps=2",
                          "trainer.valid_every_n_steps=0", "data.valid_samples=4")
    made = credit_command("data", "stats", "--no-progress", *base, env=env, cwd=REPO)
    assert made.returncode == 0, made.stderr[-2000:]
    trained = credit_command("train", *base, env=env, cwd=REPO)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert (tmp_path / "run" / "metrics.csv").exists()
