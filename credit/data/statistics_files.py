"""The mean and std files of an ERA5-layout dataset, read into per-channel arrays."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .catalog import DataError, level_index, open_store, scan_file


def first_unusable(values: np.ndarray, is_std: bool) -> tuple[int, ...] | None:
    """The index of the first statistic the data cannot be normalised with (non-finite, or a
    std <= 0: the values are divided by it), or None: the one rule for both dataset layouts."""
    values = np.atleast_1d(np.asarray(values))
    bad = ~np.isfinite(values) | ((values <= 0) if is_std else False)
    return tuple(int(i) for i in np.argwhere(bad)[0]) if bad.any() else None


def read_statistics(role_paths: dict[str, list[Path]], globs: Mapping[str, str], spec,
                    levels: tuple[float, ...], level_dim: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(mean, std) per channel of each group ("state", "forcing", "static", "target") from
    the mean and std files: a profile over `levels` for upper-air variables, a scalar
    otherwise; a `DataError` naming the file and variable for anything missing, misshaped,
    non-finite or a std <= 0."""
    stats = {}
    for role in ("mean", "std"):
        opened = [open_store(p) for p in role_paths[role]]
        try:
            for var in spec.upper_air + spec.surface + spec.forcing + spec.static + spec.diagnostic:
                hit = next((ds for ds in opened if var in ds.data_vars), None)
                src = role_paths[role][[ds is hit for ds in opened].index(True)] if hit is not None else None
                if hit is None:
                    raise DataError(f"variable {var!r} not found in the {role} files "
                                    f"{[p.name for p in role_paths[role]]} matching {globs[role]!r}")
                da = hit[var]
                if var in spec.upper_air and level_dim in da.dims:
                    info = scan_file(src, level_dim)
                    vals = da.values[[level_index(info, var, lv, level_dim) for lv in levels]]
                elif da.size == 1:
                    vals = np.full(len(levels) if var in spec.upper_air else 1, float(da.values))
                else:
                    raise DataError(f"{role} of {var!r} in {src} has dims {da.dims}; expected a scalar"
                                    + (f" or a {level_dim!r} profile" if var in spec.upper_air else ""))
                vals = np.asarray(vals, np.float64).reshape(-1)
                if first_unusable(vals, role == "std") is not None:
                    raise DataError(f"{role} of {var!r} in {src} must be finite{' and > 0' * (role == 'std')}, "
                                    f"got {vals.tolist()}")
                stats[(role, var)] = vals
        finally:
            for ds in opened:
                ds.close()

    def cat(names):
        if not names:
            return np.zeros(0), np.ones(0)
        return (np.concatenate([stats[("mean", v)] for v in names]),
                np.concatenate([stats[("std", v)] for v in names]))
    return {"state": cat(spec.upper_air + spec.surface), "forcing": cat(spec.forcing), "static": cat(spec.static),
            "target": cat(spec.upper_air + spec.surface + spec.diagnostic)}
