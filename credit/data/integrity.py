"""What the files do not say out loud: times a variable lacks, and non-finite values.

A sample needs every variable at each of its times, so a variable missing from one yearly
file removes that year's samples; `missing_times_problem` names the variable, the files
without it and the samples lost (an error unless `data.allow_missing_times=true`).
`nonfinite_problem` names the file, variable, time (and level) of the first NaN or inf in
values just read (`data.nonfinite`: error, or skip the sample).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from credit.config.validate import NONFINITE_MODES
from credit.data.catalog import DataError, FileInfo, fmt_time

__all__ = ["NONFINITE_MODES", "NonFiniteData", "missing_times_problem", "nonfinite_problem"]


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
