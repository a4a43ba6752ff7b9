"""Scan netCDF files and zarr stores once and describe what they hold: variables, dims, times, levels, grid.

:class:`DataError` is the one exception type of the data layer; every message names the file(s)
and the variable or coordinate at fault, and what would have been accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr

LAT_NAMES = ("latitude", "lat")
LON_NAMES = ("longitude", "lon")
TIME_NAME = "time"
HOUR_NS = 3_600_000_000_000  # times are int64 nanoseconds since the epoch throughout


class DataError(ValueError):
    """A dataset configuration does not match the files on disk (one message, naming file and variable)."""


@dataclass
class FileInfo:
    """What one file holds, as scanned at construction (coordinates are copied, the file is closed)."""

    path: Path
    dims: dict[str, tuple[str, ...]]  # variable -> its dimension names
    lat_name: str | None = None
    lon_name: str | None = None
    lat: np.ndarray | None = None
    lon: np.ndarray | None = None
    times: np.ndarray | None = None  # int64 ns since epoch
    levels: np.ndarray | None = None

    @property
    def name(self) -> str:
        return self.path.name


def _first_present(names: tuple[str, ...], ds: xr.Dataset) -> str | None:
    return next((n for n in names if n in ds.dims or n in ds.coords), None)


ZARR_MARKERS = ("zarr.json", ".zgroup", ".zmetadata")  # zarr v3 / v2 / consolidated v2


def is_zarr_store(path: Path) -> bool:
    """A directory that is a zarr store (named *.zarr, or holding zarr group metadata)."""
    return path.is_dir() and (path.suffix == ".zarr" or any((path / m).exists() for m in ZARR_MARKERS))


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # netCDF-4 files are HDF5 files


def is_hdf5_file(path: Path) -> bool:
    """A file that starts with the HDF5 signature (netCDF-4); netCDF-3 classic files do not."""
    try:
        with open(path, "rb") as f:
            return f.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE
    except OSError:
        return False


def open_store(path: Path, cache: bool = True, bulk_reads: bool = False) -> xr.Dataset:
    """Open a netCDF file or a zarr store lazily (no dask: reads happen on indexing).

    With `bulk_reads`, a netCDF-4 (HDF5) file opens through h5netcdf: it reads the same bytes
    through h5py, 3-10x faster than netCDF4-python's netCDF-C path for whole fields in large
    chunks (benchmarks/data.py; the decoding is xarray's either way), but opens ~4x slower,
    so metadata reads (scans, statistics) keep the netCDF4 engine, as do netCDF-3 files,
    which h5py cannot read."""
    if is_zarr_store(path):
        return xr.open_dataset(path, engine="zarr", chunks=None, cache=cache)
    engine = "h5netcdf" if bulk_reads and is_hdf5_file(path) else "netcdf4"
    return xr.open_dataset(path, engine=engine, cache=cache)


def scan_file(path: Path, level_dim: str) -> FileInfo:
    """Read the coordinates and variable dims of ``path`` (closed again before returning)."""
    try:
        ds = open_store(path)
    except Exception as err:  # unreadable / not netCDF or zarr: say which file
        kind = "a zarr store" if path.is_dir() else "netCDF"
        raise DataError(f"cannot open {path} as {kind}: {err}") from err
    with ds:
        info = FileInfo(path=path, dims={k: tuple(map(str, v.dims)) for k, v in ds.data_vars.items()})
        info.lat_name, info.lon_name = _first_present(LAT_NAMES, ds), _first_present(LON_NAMES, ds)
        if info.lat_name is not None:
            info.lat = np.asarray(ds[info.lat_name].values, dtype=np.float64)
        if info.lon_name is not None:
            info.lon = np.asarray(ds[info.lon_name].values, dtype=np.float64)
        if TIME_NAME in ds.coords:
            values = np.asarray(ds[TIME_NAME].values).reshape(-1)
            if not np.issubdtype(values.dtype, np.datetime64):
                raise DataError(f"time coordinate of {path} could not be decoded to datetimes "
                                f"(dtype {values.dtype}); use a standard/proleptic_gregorian calendar")
            info.times = values.astype("datetime64[ns]").astype(np.int64)
        if level_dim in ds.coords:
            info.levels = np.asarray(ds[level_dim].values, dtype=np.float64).reshape(-1)
    return info


def _inside_store(root: Path, path: Path) -> bool:
    return any(is_zarr_store(root / parent) for parent in path.relative_to(root).parents
               if parent != Path("."))


def resolve_glob(root: Path, role: str, pattern: str) -> list[Path]:
    """netCDF files and zarr stores under ``root`` matching ``pattern`` (sorted); DataError when
    there are none."""
    if not isinstance(pattern, str) or not pattern:
        raise DataError(f"files[{role!r}] must be a non-empty glob relative to root {root}, got {pattern!r}")
    # netCDF files and zarr stores (directories); never the files inside a store
    paths = sorted(p for p in root.glob(pattern)
                   if (p.is_file() or is_zarr_store(p)) and not _inside_store(root, p))
    if not paths:
        raise DataError(f"files[{role!r}] = {pattern!r} matches no file under root {root}")
    return paths


def level_index(info: FileInfo, var: str, level: float, level_dim: str) -> int:
    """Index of ``level`` in the file's ``level_dim`` coordinate; DataError listing available levels."""
    avail = info.levels if info.levels is not None else np.array([])
    hits = np.flatnonzero(np.isclose(avail, float(level), rtol=0.0, atol=1e-6))
    if len(hits) == 0:
        shown = ", ".join(f"{lv:g}" for lv in avail) or "none"
        raise DataError(f"level {float(level):g} of variable {var!r} is not in {info.path} "
                        f"({level_dim!r} coordinate); available levels: {shown}")
    return int(hits[0])


def fmt_time(ns: int) -> str:
    return str(np.datetime64(int(ns), "ns").astype("datetime64[s]"))


def parse_period(period: tuple[str, str]) -> tuple[int, int]:
    """Inclusive (start, end) in ns. An end given at day (month, year) precision covers that whole day."""
    try:
        start_s, end_s = period
        start = np.datetime64(start_s)
        end = np.datetime64(end_s)
    except Exception as err:
        raise DataError(f"period must be (start, end) ISO dates/times, got {period!r}: {err}") from err
    unit = np.datetime_data(end.dtype)[0]
    end_ns = end.astype("datetime64[ns]").astype(np.int64)
    if unit in ("Y", "M", "W", "D"):
        end_ns = (end + np.timedelta64(1, unit)).astype("datetime64[ns]").astype(np.int64) - 1
    start_ns = start.astype("datetime64[ns]").astype(np.int64)
    if start_ns > end_ns:
        raise DataError(f"period {tuple(period)} ends before it starts")
    return int(start_ns), int(end_ns)
