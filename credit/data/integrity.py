"""What the files do not say out loud: times a variable lacks, and non-finite values.

A sample needs every variable at each of its times, so a variable missing from one yearly
file removes that year's samples; `missing_times_problem` names the variable, the files
without it and the samples lost (an error unless `data.allow_missing_times=true`).
`nonfinite_problem` names the file, variable, time (and level) of the first NaN or inf in
values just read (`data.nonfinite`: error, or skip the sample). `missing_zarr_chunk` finds a
time step's chunk file that a zarr store lacks (read through xarray, it would be fill values).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from credit.config.validate import NONFINITE_MODES
from credit.data.catalog import DataError, FileInfo, fmt_time

__all__ = ["NONFINITE_MODES", "NonFiniteData", "missing_times_problem", "missing_zarr_chunk", "missing_zarr_rows",
           "nonfinite_problem"]


class NonFiniteData(DataError):
    """A NaN or inf in values read from a file."""


def _starts(times: np.ndarray, n: int, step: int) -> int:
    """How many t in `times` have t, t + step, ..., t + (n-1) step all in `times`."""
    ok = np.ones(len(times), bool)
    for k in range(1, n):
        ok &= np.isin(times + k * step, times, assume_unique=True)
    return int(ok.sum())


def missing_times_problem(
    times_of: Mapping[str, np.ndarray], role_of: Mapping[str, str], files_of_role: Mapping[str, Sequence[FileInfo]],
    start: int, end: int, n: int, step: int,
) -> str | None:
    """None when every variable has every time any variable has in [start, end]; else one
    line naming each incomplete variable, the files of its role that lack it, and how many
    samples of `n` consecutive times the gaps remove."""
    inside = {var: t[(t >= start) & (t <= end)] for var, t in times_of.items()}
    union = np.unique(np.concatenate(list(inside.values())))
    parts = []
    for var, t in inside.items():
        gap = np.setdiff1d(union, t, assume_unique=True)
        if len(gap) == 0:
            continue
        lacking = [info.name for info in files_of_role[role_of[var]]
                   if var not in info.dims and info.times is not None and np.isin(info.times, gap).any()]
        where = f"absent from {lacking}" if lacking else "missing from its files"
        parts.append(f"{var!r} ({role_of[var]}) is {where} at {len(gap)} of {len(union)} times "
                     f"(first {fmt_time(int(gap[0]))})")
    if not parts:
        return None
    common = union
    for t in inside.values():
        common = np.intersect1d(common, t, assume_unique=True)
    dropped = _starts(union, n, step) - _starts(common, n, step)
    return f"{'; '.join(parts)}: {dropped} samples of the period would be dropped"


def nonfinite_problem(values: np.ndarray, var: str, info: FileInfo, times: np.ndarray | None,
                      levels: Sequence[float] | None,
                      remedy: str = "set data.nonfinite=skip_sample to train without the samples that read them",
                      ) -> str | None:
    """None when `values` ((T, [L,] H, W) read from `info` (a FileInfo or a path) at `times`)
    are all finite; else where the first NaN or inf is, and `remedy`."""
    # A finite sum proves every element finite (NaN and inf propagate through a sum; an
    # overflow only sends the check below), and costs one read of `values` and no mask.
    if np.isfinite(values.sum()):
        return None
    bad = ~np.isfinite(values)
    if not bad.any():
        return None
    first = np.unravel_index(int(np.flatnonzero(bad)[0]), values.shape)
    kind = "NaN" if np.isnan(values[first]) else "inf"
    at = []
    if times is not None:
        at.append(f"time {fmt_time(int(times[first[0]]))}")
    if levels is not None:
        at.append(f"level {levels[first[1]]:g}")
    where = f" at {', '.join(at)}" if at else ""
    path = getattr(info, "path", info)
    return f"{int(bad.sum())} non-finite values ({kind} first) in {var!r} of {path}{where}; {remedy}"


@functools.lru_cache(maxsize=4096)
def _zarr_chunking(array_dir: Path) -> tuple[tuple[int, ...], tuple[int, ...], str, str] | None:
    """(shape, chunks, key separator, key prefix) of a zarr v2 or v3 array folder, or None when
    it is not one (v3: the chunk grid's chunk shape, or its shards when sharded)."""
    if (array_dir / ".zarray").is_file():
        spec = json.loads((array_dir / ".zarray").read_text())
        return tuple(spec["shape"]), tuple(spec["chunks"]), spec.get("dimension_separator") or ".", ""
    if (array_dir / "zarr.json").is_file():
        spec = json.loads((array_dir / "zarr.json").read_text())
        if spec.get("node_type") != "array":
            return None
        grid = dict(spec.get("chunk_grid") or {}).get("configuration") or {}
        encoding = dict(spec.get("chunk_key_encoding") or {"name": "default"})
        separator = dict(encoding.get("configuration") or {}).get("separator")
        if encoding.get("name") == "v2":
            return tuple(spec["shape"]), tuple(grid["chunk_shape"]), separator or ".", ""
        return tuple(spec["shape"]), tuple(grid["chunk_shape"]), separator or "/", "c" + (separator or "/")
    return None


def _chunk_path(array_dir: Path, index: Sequence[int], separator: str, prefix: str) -> Path:
    return array_dir / (prefix + separator.join(str(i) for i in index))


def missing_zarr_chunk(store: Path, var: str, time_row: int) -> Path | None:
    """The first chunk file of `var` at time index `time_row` (its first axis) that a zarr v2 or
    v3 directory store lacks, or None. zarr reads an absent chunk as the array's fill value
    (NaN, or with no fill value zeros), so a deleted or never-written chunk would train
    silently; one stat per chunk of the time step."""
    folder = Path(store) / var
    chunking = _zarr_chunking(folder)
    if chunking is None:
        return None
    shape, chunks, sep, prefix = chunking
    per_axis = [range(-(-n // c)) for n, c in zip(shape[1:], chunks[1:])]
    for rest in itertools.product(*per_axis):
        path = _chunk_path(folder, (time_row // chunks[0], *rest), sep, prefix)
        if not path.is_file():
            return path
    return None


def missing_zarr_rows(store: Path, var: str) -> list[int]:
    """The time indices (first axis) of `var` whose chunks a zarr v2 or v3 directory store
    lacks, from one listing of the variable's folder (a whole store, before any read); []
    when the array is complete or not a zarr array folder."""
    folder = Path(store) / var
    chunking = _zarr_chunking(folder)
    if chunking is None or not chunking[0]:
        return []
    shape, chunks, sep, prefix = chunking
    per_time = 1
    for n, c in zip(shape[1:], chunks[1:]):
        per_time *= -(-n // c)
    if sep == "." and not prefix:  # flat folder: one listing
        keys = [entry.name for entry in os.scandir(folder) if not entry.name.startswith(".")]
    else:
        keys = [f.relative_to(folder).as_posix().replace("/", sep) for f in folder.rglob("*")
                if f.is_file() and f.name != "zarr.json" and not f.name.startswith(".")]
    stored: dict[int, int] = {}
    for key in keys:
        if not key.startswith(prefix.replace("/", sep)):
            continue
        head = key[len(prefix):].split(sep, 1)[0]
        if head.isdigit():
            stored[int(head)] = stored.get(int(head), 0) + 1
    rows = []
    for i in range(-(-shape[0] // chunks[0])):
        if stored.get(i, 0) < per_time:
            rows += range(i * chunks[0], min((i + 1) * chunks[0], shape[0]))
    return rows
