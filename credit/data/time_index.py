"""The time index of an ERA5-layout catalog: where each variable's times live, and which
sample start times a period holds (`credit.data.dataset.ERA5Dataset` builds both once)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .catalog import HOUR_NS, TIME_NAME, DataError, FileInfo, fmt_time, level_index, parse_period
from .integrity import missing_times_problem

log = logging.getLogger(__name__)

TIME_ROLES = ("upper_air", "surface", "forcing", "diagnostic")
# per variable: its sorted times, the files holding it, and each time's file and index in that file
Where = tuple[np.ndarray, list[FileInfo], np.ndarray, np.ndarray]


def index_times(spec, files_with: Callable[[str, str, tuple[str, ...]], list[FileInfo]],
                levels: tuple[float, ...], level_dim: str) -> tuple[dict[str, Where], dict[tuple[str, Path], list[int]], int]:
    """Per variable: sorted times and where each lives (file, index in file); each upper-air
    variable's level indices per file; the files' common time step [ns]. `files_with(role,
    var, dims)`: the files of a role holding a variable, its dims checked."""
    step, step_file = None, None
    where: dict[str, Where] = {}
    level_idx: dict[tuple[str, Path], list[int]] = {}
    for role in TIME_ROLES:
        want = ("time", "level", "lat", "lon") if role == "upper_air" else ("time", "lat", "lon")
        for var in getattr(spec, role):
            infos = files_with(role, var, want)
            times, fidx, lidx = [], [], []
            for k, info in enumerate(infos):
                if info.times is None:
                    raise DataError(f"{info.path} holds {var!r} ({role}) but has no {TIME_NAME!r} coordinate")
                if len(info.times) > 1:
                    diffs = np.unique(np.diff(info.times))
                    if len(diffs) != 1 or diffs[0] <= 0:
                        raise DataError(f"time axis of {info.path} ({var!r}) is not uniformly increasing; "
                                        f"steps found (h): {sorted(set(diffs / HOUR_NS))[:5]}")
                    if step is None:
                        step, step_file = int(diffs[0]), info.path
                    elif diffs[0] != step:
                        raise DataError(f"time step of {info.path} ({diffs[0] / HOUR_NS:g} h) differs from "
                                        f"{step_file} ({step / HOUR_NS:g} h)")
                if role == "upper_air":
                    level_idx[(var, info.path)] = [level_index(info, var, lv, level_dim) for lv in levels]
                times.append(info.times)
                fidx.append(np.full(len(info.times), k))
                lidx.append(np.arange(len(info.times)))
            t = np.concatenate(times)
            order = np.argsort(t, kind="stable")
            t, f, li = t[order], np.concatenate(fidx)[order], np.concatenate(lidx)[order]
            if len(t) > 1 and np.any(np.diff(t) == 0):
                dup = t[np.flatnonzero(np.diff(t) == 0)[0]]
                raise DataError(f"time {fmt_time(dup)} of {var!r} appears in more than one of "
                                f"{[i.name for i in infos]}")
            where[var] = (t, infos, f, li)
    if step is None:
        raise DataError("cannot infer the time step: every file of the time-dependent roles holds a single time")
    return where, level_idx, step


def select_starts(where: dict[str, Where], step_ns: int, history_len: int, forecast_len: int, variables,
                  files_of_role: dict[str, list[FileInfo]], period: tuple[str, str], stride: int,
                  allow_missing_times: bool) -> np.ndarray:
    """The start times of every sample of `history_len + forecast_len` consecutive times in
    `period` that every variable has, every `stride`-th kept; a `DataError` for times missing
    from some variables (unless `allow_missing_times`: a warning) and for an empty period."""
    start, end = parse_period(period)
    all_times = [w[0] for w in where.values()]
    first, last = min(t[0] for t in all_times), max(t[-1] for t in all_times)
    data_files = sorted({i.name for w in where.values() for i in w[1]})
    if start < first or end >= last + step_ns:
        raise DataError(f"period {tuple(period)} lies outside the data: files {data_files} span "
                        f"{fmt_time(first)} to {fmt_time(last)} every {step_ns / HOUR_NS:g} h")
    n = history_len + forecast_len
    role_of = {v: role for role in TIME_ROLES for v in getattr(variables, role)}
    problem = missing_times_problem({v: w[0] for v, w in where.items()}, role_of, files_of_role,
                                    start, end, n, step_ns)
    if problem and not allow_missing_times:
        raise DataError(f"period {tuple(period)}: {problem}; set data.allow_missing_times=true to "
                        f"train on the rest")
    if problem:
        log.warning("period %s: %s (data.allow_missing_times=true: left out)", tuple(period), problem)
    valid = all_times[0]
    for t in all_times[1:]:
        valid = np.intersect1d(valid, t, assume_unique=True)
    valid = valid[(valid >= start) & (valid <= end)]
    ok = np.ones(len(valid), bool)
    for k in range(1, n):
        ok &= np.isin(valid + k * step_ns, valid, assume_unique=True)
    starts = valid[ok][::stride]
    if len(starts) == 0:
        raise DataError(f"period {tuple(period)} yields no sample of {n} consecutive "
                        f"{step_ns / HOUR_NS:g}-hourly times (history_len={history_len}, "
                        f"forecast_len={forecast_len}) present in all of {data_files}")
    return starts
