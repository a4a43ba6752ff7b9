"""Which init times a rollout runs, and whether the data hold every time they need.

An init time t with `history_len` h and `lead_steps` L needs every time-dependent variable
at t - (h-1)*step ... t (the input frames) and at t + step ... t + L*step (forcing at each
predicted time, and the truth the skill is scored against).
"""

from __future__ import annotations

import numpy as np
from omegaconf import DictConfig

from credit.data import role_files
from credit.data.catalog import HOUR_NS, scan_file
from credit.rollout.errors import RolloutError

_TIME_ROLES = ("upper_air", "surface", "forcing", "diagnostic")


def fmt(ns: int) -> str:
    """An instant as ISO text to the minute, e.g. 2001-01-01T06:00."""
    return str(np.datetime64(int(ns), "ns").astype("datetime64[m]"))


def init_times(rollout: DictConfig) -> list[int]:
    """The requested init times (ns since epoch) in the order given; `init_times` when
    non-empty, else the `init_range` start, start + every_hours, ... <= end."""
    if rollout.init_times:
        times = [int(np.datetime64(v, "ns").astype(np.int64)) for v in rollout.init_times]
        repeated = sorted({t for t in times if times.count(t) > 1})
        if repeated:
            raise RolloutError(f"rollout.init_times lists {fmt(repeated[0])} more than once")
        return times
    span = rollout.init_range
    start = int(np.datetime64(span.start, "ns").astype(np.int64))
    end = int(np.datetime64(span.end, "ns").astype(np.int64))
    return list(range(start, end + 1, int(span.every_hours) * HOUR_NS))


def data_times(data: DictConfig) -> np.ndarray:
    """Times (ns, sorted) at which every time-dependent variable of `data` is on disk."""
    common: np.ndarray | None = None
    computed = data.credit.tisr.variable if data.credit.tisr.source is not None else None  # no file holds it
    for role in _TIME_ROLES:
        names = [n for n in data.variables[role] if not (role == "forcing" and n == computed)]
        if not names:
            continue
        infos = [scan_file(p, data.level_dim) for p in role_files(data, role)]
        for name in names:
            held = [i.times for i in infos if name in i.dims and i.times is not None]
            times = np.unique(np.concatenate(held)) if held else np.zeros(0, np.int64)
            common = times if common is None else np.intersect1d(common, times)
    return np.zeros(0, np.int64) if common is None else common


def time_step(times: np.ndarray) -> int:
    """The data's time step (ns): the smallest spacing of consecutive times."""
    if len(times) < 2:
        raise RolloutError("the data hold fewer than two common times; no forecast step can be inferred")
    return int(np.diff(times).min())


def describe_span(times: np.ndarray, step: int, data_root: str) -> str:
    """'2000-01-01T00:00 to 2000-01-12T18:00, 2001-01-01T00:00 to ...' (contiguous runs)."""
    if len(times) == 0:
        return f"the data under {data_root} hold no time common to every variable"
    breaks = np.flatnonzero(np.diff(times) != step)
    starts = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks, [len(times) - 1]])
    runs = [f"{fmt(times[a])} to {fmt(times[b])}" for a, b in zip(starts, ends)]
    shown = ", ".join(runs[:3]) + (f" and {len(runs) - 3} more spans" if len(runs) > 3 else "")
    return f"the data under {data_root} span {shown} every {step / HOUR_NS:g} h"


def check_coverage(inits: list[int], times: np.ndarray, step: int, history_len: int,
                   lead_steps: int, data_root: str) -> None:
    """Raise RolloutError naming the first init time whose inputs, forcing or truth are missing."""
    available = set(times.tolist())
    for init in inits:
        needed = init + step * np.arange(-(history_len - 1), lead_steps + 1)
        missing = [int(t) for t in needed if int(t) not in available]
        if missing:
            why = "is outside the data" if init not in available else (
                f"needs data up to {fmt(needed[-1])} (lead_steps={lead_steps}) and "
                f"from {fmt(needed[0])} (history_len={history_len}); {fmt(missing[0])} is missing")
            raise RolloutError(f"rollout init time {fmt(init)} {why}: "
                               f"{describe_span(times, step, data_root)}")


def forecast_filename(init: int) -> str:
    """forecast_2001-01-01T00.nc (minutes appended when not zero)."""
    stamp = np.datetime64(int(init), "ns").astype("datetime64[m]").item()
    text = stamp.strftime("%Y-%m-%dT%H") + (stamp.strftime("%M") if stamp.minute else "")
    return f"forecast_{text}.nc"


