"""`credit data stats`: the mean and standard deviation files the dataset normalizes with.

Streams every variable of `data.variables` over `data.train_period` once, through the same
catalog and reads as training (so the same globs, levels, missing-time and non-finite rules
apply), in chunks of whole time steps sized to a memory budget, and accumulates float64
moments with :class:`~credit.data.moments.RunningMoments`. Writes `mean.nc` and `std.nc`
(the names in `data.files.mean` / `data.files.std`) into `data.root` in the layout the
dataset reads: a profile over `data.level_dim` for upper-air variables, scalars otherwise
(static and forcing included), with the period, the files and the method as attributes.
Existing files are kept unless `--overwrite`; both files are written to temporary names
first and renamed together at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xarray as xr
from omegaconf import DictConfig
from tqdm import tqdm

from .catalog import DataError, fmt_time
from .dataset import ERA5Dataset
from .integrity import NonFiniteData
from .moments import RunningMoments

CHUNK_BYTES = 256 * 2**20
"""Memory budget of one read: as many whole time steps of one variable as fit."""

METHOD = ("float64; per chunk of whole time steps, the mean and the sum of squared deviations "
          "(two passes); chunks merged with the pairwise update of Chan, Golub and LeVeque; "
          "population std (divided by the count)")


def _dataset(data: DictConfig) -> ERA5Dataset:
    from .from_config import variable_spec

    return ERA5Dataset(
        data.root, files=dict(data.files), variables=variable_spec(data), levels=list(data.levels),
        period=tuple(data.train_period), history_len=1, forecast_len=1, normalize=False,
        level_dim=data.level_dim, nonfinite=data.nonfinite, allow_missing_times=data.allow_missing_times,
        statistics=False,
    )


def output_paths(data: DictConfig) -> tuple[Path, Path]:
    """Where the statistics go: `data.files.mean` and `data.files.std` under `data.root`."""
    paths = []
    for role in ("mean", "std"):
        name = str(data.files[role])
        if any(c in name for c in "*?["):
            raise DataError(f"data.files.{role}={name!r} is a glob; credit data stats writes one file: "
                            f"set data.files.{role} to a file name (e.g. {role}.nc)")
        paths.append(Path(data.root) / name)
    return paths[0], paths[1]


def _accumulate(ds: ERA5Dataset, var: str, moments: RunningMoments, bar: tqdm) -> int:
    """Fold the period's values of time-dependent `var` into `moments`; return the number of
    time steps left out for non-finite values (only with data.nonfinite=skip_sample)."""
    times = ds.times_in_period(var)
    upper = var in ds.variables.upper_air
    per_time = 4 * (len(ds.levels) if upper else 1) * int(np.prod(ds.grid_shape))
    step = max(1, CHUNK_BYTES // per_time)
    axes = (0, 2, 3) if upper else (0, 1, 2)
    skipped = 0
    for start in range(0, len(times), step):
        chunk = times[start:start + step]
        try:
            moments.add(var, ds.read_raw(var, chunk), axes)
        except NonFiniteData as error:
            if ds.nonfinite == "error":
                raise DataError(f"{error}; statistics need finite values") from None
            for t in chunk:  # skip_sample: leave out the time steps that hold them
                try:
                    moments.add(var, ds.read_raw(var, t[None]), axes)
                except NonFiniteData:
                    skipped += 1
        bar.update(len(chunk))
    if var not in moments.count:
        raise DataError(f"variable {var!r} has no finite time step in data.train_period "
                        f"{list(ds.times_in_period(var)[[0, -1]].astype('datetime64[s]').astype(str))}")
    return skipped


def compute_statistics(data: DictConfig, progress: bool = True) -> tuple[xr.Dataset, xr.Dataset, dict]:
    """(mean, std, report) of every variable of `data` over `data.train_period`."""
    ds = _dataset(data)
    spec = ds.variables
    timed = spec.upper_air + spec.surface + spec.forcing + spec.diagnostic
    moments = RunningMoments()
    skipped: dict[str, int] = {}
    total = sum(len(ds.times_in_period(v)) for v in timed)
    with tqdm(total=total, desc="stats", unit="time step", disable=not progress) as bar:
        for var in timed:
            skipped[var] = _accumulate(ds, var, moments, bar)
    for var in spec.static:
        moments.add(var, ds.read_static_raw(var), (0, 1))

    files = sorted({p.relative_to(ds.root).as_posix() for v in timed + spec.static for p in ds.files_of(v)})
    times = np.concatenate([ds.times_in_period(v) for v in timed])
    period = f"{fmt_time(times.min())} to {fmt_time(times.max())}"
    level_dim = data.level_dim
    out = []
    for name in ("mean", "std"):
        values = {}
        for var in timed + spec.static:
            stat = moments.mean[var] if name == "mean" else moments.std(var)
            attrs = {"count": moments.count[var]}
            if var in spec.upper_air:
                values[var] = ((level_dim,), stat, attrs)
            else:
                values[var] = ((), np.float64(stat), attrs)
        result = xr.Dataset(values, coords={level_dim: (level_dim, np.asarray(ds.levels, np.float64))})
        result.attrs.update(
            statistic=name, period=period, train_period=" to ".join(map(str, data.train_period)),
            files=" ".join(files), method=METHOD, created_by="credit data stats",
            description=f"{name} over time, latitude and longitude (static: latitude and longitude) "
                        f"of the training period, per {level_dim} for upper-air variables")
        out.append(result)
    report = dict(files=files, period=period, skipped=skipped, variables=len(timed + spec.static))
    return out[0], out[1], report


def write_statistics(data: DictConfig, overwrite: bool = False, progress: bool = True) -> dict:
    """Compute and write the statistics files; refuse to replace existing ones unless
    `overwrite`. Returns the report (paths, period, files, skipped time steps)."""
    mean_path, std_path = output_paths(data)
    existing = [str(p) for p in (mean_path, std_path) if p.exists()]
    if existing and not overwrite:
        raise DataError(f"{' and '.join(existing)} already exist; pass --overwrite to replace them")
    mean, std, report = compute_statistics(data, progress)
    temporary = []
    try:
        for result, path in ((mean, mean_path), (std, std_path)):
            tmp = path.with_name(path.name + ".tmp")
            result.to_netcdf(tmp, engine="netcdf4")
            temporary.append((tmp, path))
        for tmp, path in temporary:
            os.replace(tmp, path)
    finally:
        for tmp, _ in temporary:
            tmp.unlink(missing_ok=True)
    return {**report, "mean": str(mean_path), "std": str(std_path)}


def main(argv: Sequence[str]) -> int:
    """`credit data stats [--overwrite] [--no-progress] [KEY=VALUE ...]`."""
    from credit.config import ConfigError, compose_config

    parser = argparse.ArgumentParser(
        prog="credit data stats",
        description="Write data.files.mean / data.files.std under data.root from data.train_period "
                    "(the overrides are credit train's).")
    parser.add_argument("--overwrite", action="store_true", help="replace existing statistics files")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    flags = [a for a in argv if a.startswith("-")]
    overrides = [a for a in argv if not a.startswith("-")]
    args = parser.parse_args(flags)
    try:
        cfg = compose_config(overrides)
        report = write_statistics(cfg.data, overwrite=args.overwrite, progress=not args.no_progress)
    except (ConfigError, DataError) as error:
        print(f"credit data stats: error: {error}", file=sys.stderr)
        return 2
    skipped = sum(report["skipped"].values())
    print(f"wrote {report['mean']} and {report['std']}: {report['variables']} variables over "
          f"{report['period']} from {len(report['files'])} files"
          + (f"; {skipped} non-finite time steps left out" if skipped else ""))
    return 0
