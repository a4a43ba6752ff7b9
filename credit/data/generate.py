"""Write a synthetic dataset in ERA5 layout from the toy atmosphere in :mod:`credit.data.physics`.

Files written into ``out`` (``.nc``, or ``.zarr`` stores with ``file_format="zarr"``):

* ``era5_{year}.nc``  upper-air ``U V T Q`` (time, level, latitude, longitude), surface ``SP t2m``
* ``forcing_{year}.nc``  ``tsi`` (time, latitude, longitude)
* ``static.nc``  ``Z_GDS4_SFC``, ``LSM`` (latitude, longitude)
* ``mean.nc`` / ``std.nc``  statistics over the training years (per level for upper-air variables;
  netCDF in either format, as ``credit data stats`` writes them)

Data variables are chunked one time step per chunk, as ERA5 archives are.

CLI: ``credit data generate`` (:mod:`credit.data.generate_command`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Sequence

import numpy as np
import xarray as xr
from tqdm import tqdm

from .catalog import DataError, parse_period
from .moments import RunningMoments
from .physics import ToyAtmosphere

UPPER_AIR = ("U", "V", "T", "Q")
SURFACE = ("SP", "t2m")
FORCING = ("tsi",)
STATIC = ("Z_GDS4_SFC", "LSM")
OUTPUT_STEP_H = 6
SUBSTEP_S = 3600.0
SPIN_UP_DAYS = 30
_TIME_REF = np.datetime64("2000-01-01T00:00", "ns").astype(np.int64)  # model clock origin

ATTRS = {
    "U": dict(units="m s-1", long_name="U component of wind", standard_name="eastward_wind"),
    "V": dict(units="m s-1", long_name="V component of wind", standard_name="northward_wind"),
    "T": dict(units="K", long_name="Temperature", standard_name="air_temperature"),
    "Q": dict(units="kg kg-1", long_name="Specific humidity", standard_name="specific_humidity"),
    "SP": dict(units="Pa", long_name="Surface pressure", standard_name="surface_air_pressure"),
    "t2m": dict(units="K", long_name="2 metre temperature", standard_name="air_temperature"),
    "tsi": dict(units="W m-2", long_name="Top-of-atmosphere solar irradiance",
                standard_name="toa_incoming_shortwave_flux"),
    "Z_GDS4_SFC": dict(units="m2 s-2", long_name="Surface geopotential", standard_name="surface_geopotential"),
    "LSM": dict(units="1", long_name="Land-sea mask (1 = land)", standard_name="land_binary_mask"),
}


FORMATS = {"netcdf": ".nc", "zarr": ".zarr"}
"""File formats the generator writes, and their file extensions."""


class GenerateError(ValueError):
    """Invalid generator arguments or output location."""


def _grid_coords(grid: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    n_lat, n_lon = grid
    # ERA5 order: latitude from the North Pole to the South Pole, poles included; longitude 0..360.
    return np.linspace(90.0, -90.0, n_lat), np.arange(n_lon) * (360.0 / n_lon)


def _output_times(years: Sequence[int], days_per_year: int | None,
                  time_range: tuple[str, str] | None) -> dict[int, np.ndarray]:
    out = {}
    lo, hi = parse_period(time_range) if time_range is not None else (None, None)
    for year in years:
        start = np.datetime64(f"{year:04d}-01-01", "ns")
        end = np.datetime64(f"{year + 1:04d}-01-01", "ns")
        if days_per_year is not None:
            end = min(end, start + np.timedelta64(days_per_year, "D"))
        times = np.arange(start, end, np.timedelta64(OUTPUT_STEP_H, "h")).astype("datetime64[ns]")
        if lo is not None:
            ns = times.astype(np.int64)
            times = times[(ns >= lo) & (ns <= hi)]
        if len(times) == 0:
            raise GenerateError(f"year {year} has no output time inside time_range {time_range}")
        out[year] = times
    return out


def _coords(lat, lon, levels=None, times=None) -> dict:
    coords = {
        "latitude": ("latitude", lat, dict(units="degrees_north", standard_name="latitude", long_name="latitude")),
        "longitude": ("longitude", lon, dict(units="degrees_east", standard_name="longitude", long_name="longitude")),
    }
    if levels is not None:
        coords["level"] = ("level", levels, dict(units="hPa", long_name="pressure level",
                                                 standard_name="air_pressure", positive="down"))
    if times is not None:
        coords["time"] = ("time", times, dict(standard_name="time", long_name="time"))
    return coords


def write_atomically(ds: xr.Dataset, path: Path) -> None:
    """Write atomically (temporary name, then rename) so an interrupted run leaves no half file;
    a ``.zarr`` path becomes a zarr store, anything else a netCDF file."""
    ds.attrs.update(Conventions="CF-1.8", title="credit synthetic ERA5-layout dataset",
                    source="credit.data.generate toy atmosphere")
    encoding = {name: {"_FillValue": None} for name in list(ds.data_vars) + list(ds.coords)}
    for name, var in ds.data_vars.items():
        if "time" in var.dims:  # one time step per chunk, as ERA5 archives are
            encoding[name]["chunksizes" if path.suffix != ".zarr" else "chunks"] = tuple(
                1 if d == "time" else n for d, n in zip(var.dims, var.shape))
    if "time" in ds.coords:
        encoding["time"] = {"units": "hours since 1900-01-01 00:00:00", "calendar": "proleptic_gregorian",
                            "dtype": "int64", "_FillValue": None}
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".zarr":
        shutil.rmtree(tmp, ignore_errors=True)
        ds.to_zarr(tmp, mode="w", encoding=encoding, zarr_format=2, consolidated=True)
        shutil.rmtree(path, ignore_errors=True)
    else:
        ds.to_netcdf(tmp, engine="netcdf4", encoding=encoding)
    os.replace(tmp, path)


def generate_dataset(out: str | Path, *, grid: tuple[int, int] = (32, 64), years: Sequence[int] = (2000, 2001),
                     levels: Sequence[float] = (300, 500, 700, 850), train_years: Sequence[int] | None = None,
                     seed: int = 0, progress: bool = True, days_per_year: int | None = None,
                     time_range: tuple[str, str] | None = None, overwrite: bool = False,
                     file_format: str = "netcdf") -> Path:
    """Simulate the toy atmosphere and write the dataset into ``out``; return ``out`` as a Path.

    ``train_years`` (default: all years but the last, or the only year) selects the years the
    statistics in ``mean.nc``/``std.nc`` are computed from. ``days_per_year`` keeps only the first
    N days of each year and ``time_range`` (inclusive ISO start, end) keeps only times inside it;
    both are for tests and smoke runs, and every year must keep at least one time. ``file_format``
    ("netcdf" or "zarr") is the format of the data files; the statistics are netCDF. The model runs
    continuously through the requested times after a 30-day spin-up (re-spun-up after gaps longer
    than that), hourly inside, output every 6 h. Identical arguments give identical arrays. Raises
    :class:`GenerateError` for invalid arguments or a non-empty ``out`` without ``overwrite``.
    """
    out = Path(out)
    if file_format not in FORMATS:
        raise GenerateError(f"format {file_format!r} is not one of {list(FORMATS)}")
    ext = FORMATS[file_format]
    grid, years, levels, train_years = checked_arguments(grid, years, levels, train_years, days_per_year)
    try:
        schedule = _output_times(years, days_per_year, time_range)
    except DataError as err:
        raise GenerateError(f"time_range: {err}") from err
    prepare_output_dir(out, overwrite)

    lat, lon = _grid_coords(grid)
    level_values = np.asarray(levels, dtype=np.int32 if all(lv.is_integer() for lv in levels) else np.float64)
    atm = ToyAtmosphere(lat, lon, levels, seed)
    static = {"Z_GDS4_SFC": atm.z_sfc, "LSM": atm.lsm}
    write_atomically(xr.Dataset({k: (("latitude", "longitude"), v.astype(np.float32), ATTRS[k]) for k, v in static.items()},
                      coords=_coords(lat, lon)), out / f"static{ext}")

    moments = RunningMoments()
    for year, times, buf in _simulate(atm, schedule, len(levels), grid, progress):
        coords = _coords(lat, lon, level_values, times)
        dims3, dims2 = ("time", "level", "latitude", "longitude"), ("time", "latitude", "longitude")
        era5 = {k: (dims3, buf[k], ATTRS[k]) for k in UPPER_AIR} | {k: (dims2, buf[k], ATTRS[k]) for k in SURFACE}
        write_atomically(xr.Dataset(era5, coords=coords), out / f"era5_{year}{ext}")
        coords.pop("level")
        write_atomically(xr.Dataset({k: (dims2, buf[k], ATTRS[k]) for k in FORCING}, coords=coords), out / f"forcing_{year}{ext}")
        if year in train_years:
            for k in UPPER_AIR:
                moments.add(k, buf[k], (0, 2, 3))
            for k in SURFACE + FORCING:
                moments.add(k, buf[k], (0, 1, 2))
    for k, v in static.items():
        moments.add(k, v.astype(np.float32), (0, 1))
    _write_statistics(out, moments, _coords(lat, lon, level_values)["level"], train_years)
    return out


def checked_arguments(grid, years, levels, train_years, days_per_year):
    """The arguments normalised (ints, sorted floats); :class:`GenerateError` names the bad one."""
    grid = tuple(int(g) for g in grid)
    years = sorted(int(y) for y in years)
    levels = sorted(float(lv) for lv in levels)
    if len(grid) != 2 or grid[0] < 3 or grid[1] < 4:
        raise GenerateError(f"grid must be (n_lat >= 3, n_lon >= 4), got {grid}")
    if not years or len(set(years)) != len(years) or not all(1 <= y <= 9998 for y in years):
        raise GenerateError(f"years must be distinct years in 1..9998, got {years}")
    if not levels or len(set(levels)) != len(levels) or not all(1.0 <= lv <= 1100.0 for lv in levels):
        raise GenerateError(f"levels must be distinct pressures in hPa within 1..1100, got {levels}")
    if days_per_year is not None and days_per_year < 1:
        raise GenerateError(f"days_per_year must be >= 1, got {days_per_year}")
    if train_years is None:
        train_years = years[:-1] or years
    train_years = sorted(int(y) for y in train_years)
    if not train_years or not set(train_years) <= set(years):
        raise GenerateError(f"train_years {train_years} must be a non-empty subset of years {years}")
    return grid, years, levels, train_years


def _written_files() -> list[str]:
    """Globs of what `generate_dataset` writes (finished files and their temporary copies)."""
    return [f"{stem}{ext}" if stem != "*" else f"*{ext}.tmp" for stem in ["static", "mean", "std", "era5_*",
                                                                         "forcing_*", "*"] for ext in FORMATS.values()]


def prepare_output_dir(out: Path, overwrite: bool, written: Sequence[str] | None = None) -> None:
    """Create ``out``; with ``overwrite``, remove only what matches `written` (default: the
    files this generator writes), never anything else."""
    if out.exists():
        if not out.is_dir():
            raise GenerateError(f"output path {out} exists and is not a directory")
        if any(out.iterdir()):
            if not overwrite:
                raise GenerateError(f"output directory {out} is not empty; pass --overwrite (overwrite=True) "
                                    "to replace a dataset there")
            for pattern in _written_files() if written is None else written:
                for f in out.glob(pattern):
                    shutil.rmtree(f) if f.is_dir() else f.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _simulate(atm: ToyAtmosphere, schedule: dict, n_levels: int, grid: tuple[int, int], progress: bool):
    """Yield ``(year, times, arrays)`` per year: the atmosphere's snapshots at the output times.

    The arrays are views of one set of buffers reused year after year (their first touch costs page
    faults), so a consumer must be done with a year before asking for the next.
    """
    spin_up_ns = SPIN_UP_DAYS * 86_400 * 10**9
    step_ns = int(SUBSTEP_S * 1e9)
    clock: int | None = None
    n_max = max(len(t) for t in schedule.values())
    full = {k: np.empty((n_max, n_levels, *grid), np.float32) for k in UPPER_AIR}
    full.update({k: np.empty((n_max, *grid), np.float32) for k in SURFACE + FORCING})
    with tqdm(total=sum(len(t) for t in schedule.values()), desc="generate", unit="step",
              disable=not progress) as bar:
        for year, times in schedule.items():
            buf = {k: v[:len(times)] for k, v in full.items()}
            for n, t in enumerate(times.astype(np.int64)):
                if clock is None or t - clock > spin_up_ns:
                    clock = int(t) - spin_up_ns
                    atm.initialise(clock)
                # The hourly steps up to t go in one call, which computes their state-independent
                # forcing in batches (same result as one atm.step per substep).
                clocks = list(range(clock, int(t), step_ns))
                if clocks:
                    atm.advance([(c - _TIME_REF) / 1e9 for c in clocks], clocks, SUBSTEP_S)
                    clock = clocks[-1] + step_ns
                for k, v in atm.snapshot((clock - _TIME_REF) / 1e9, clock).items():
                    buf[k][n] = v
                bar.update()
            yield year, times, buf


def _write_statistics(out: Path, moments: RunningMoments, level: tuple, train_years: list[int]) -> None:
    """Write ``mean.nc`` and ``std.nc`` (per level for upper-air variables, scalars otherwise)."""
    for name, stat in (("mean", lambda k: moments.mean[k]), ("std", moments.std)):
        data = {k: (("level",), stat(k).astype(np.float32), ATTRS[k]) for k in UPPER_AIR}
        data |= {k: ((), np.float32(stat(k)), ATTRS[k]) for k in SURFACE + FORCING + STATIC}
        ds = xr.Dataset(data, coords={"level": level})
        ds.attrs.update(statistic=name, train_years=np.asarray(train_years, np.int32),
                        description=f"{name} over time, latitude and longitude of the training years "
                                    f"{' '.join(map(str, train_years))} (per level for upper-air variables)")
        write_atomically(ds, out / f"{name}.nc")
