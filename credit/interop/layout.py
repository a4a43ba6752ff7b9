"""What CREDIT's two dataset readers (`credit_gen1`, `credit_gen2`) share: the grid, the
levels and the channel names of a sample, from the reader's `names` (role -> variables),
`level_values`, `_lat`, `_lon` and `_stores` (open files, `_store(path)`); the static file's check;
warnings once per process, times as text."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from credit.data.catalog import DataError, fmt_time, is_zarr_store
from credit.data.integrity import NonFiniteData, missing_zarr_chunk, missing_zarr_rows, nonfinite_problem

_OTHER_ROLES = ("surface", "diagnostic", "dynamic_forcing", "forcing", "static")
log = logging.getLogger(__name__)
_WARNED: set[str] = set()  # one warning per process for each finding (train and valid read the same files)


def warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning("%s", message)


def iso(t: int) -> str:
    return str(np.datetime64(int(t), "ns").astype("datetime64[m]"))


class CreditLayout:
    names: dict[str, list[str]]
    level_values: np.ndarray | None
    _lat: np.ndarray
    _lon: np.ndarray
    _stores: dict

    @staticmethod
    def check_finite(values: np.ndarray, var: str, path, times: np.ndarray | None,
                     levels: Sequence[float] | None) -> np.ndarray:
        """`values` ((T, [L,] H, W) just read), or one error naming the file, variable, time
        and level of the first NaN or inf (a missing zarr chunk reads as its fill value, NaN)."""
        problem = nonfinite_problem(values, var, path, times, levels,
                                    remedy="CREDIT's layouts are read as they are: repair or fill the file")
        if problem:
            raise NonFiniteData(problem)
        return values

    @staticmethod
    def check_stored(path, var: str, rows: Sequence[int], times: np.ndarray) -> None:
        """One error naming the store, variable, time and chunk file when a zarr store lacks the
        chunk of one of `rows` (xarray would read its fill value: NaN, zeros or stale memory)."""
        if not is_zarr_store(path):
            return
        for row, t in zip(rows, times):
            missing = missing_zarr_chunk(path, var, int(row))
            if missing is not None:
                raise DataError(f"{path}: variable {var!r} has no chunk for time {fmt_time(t)} (time index {int(row)}): "
                                f"{missing.name} is missing, and zarr would read fill values; repair the store")

    @staticmethod
    def check_store_complete(path, var: str, times: np.ndarray, needed: tuple[int, int]) -> None:
        """Before any sample: one error when a zarr store lacks a chunk of `var` at a time (ns,
        `times` per row) within `needed` (first, last, inclusive)."""
        if not is_zarr_store(path):
            return
        for row in missing_zarr_rows(path, var):
            if row < len(times) and needed[0] <= int(times[row]) <= needed[1]:
                raise DataError(f"{path}: variable {var!r} has no chunk for time {fmt_time(int(times[row]))} (time "
                                f"index {row}), which a sample reads: zarr would read fill values; repair the store")

    def check_static(self, path, drop: str | None = None) -> None:
        """Each static variable in `path` and on the data's grid (they are read at the first
        sample; a wrong grid would fail there, in a reshape). `drop`: a dimension the reader
        takes the first entry of."""
        if path is None:
            return
        ds = self._store(path)
        for var in self.names["static"]:
            if var not in ds.data_vars:
                raise DataError(f"{path} has no static variable {var!r}; it holds {sorted(ds.data_vars)}")
            shape = tuple(int(n) for d, n in zip(ds[var].dims, ds[var].shape) if d != drop)
            if tuple(n for n in shape if n != 1) != tuple(self.grid_shape):
                raise DataError(f"{path}: static variable {var!r} has shape {shape}, not the data's grid "
                                f"{tuple(self.grid_shape)} (latitude x longitude)")

    @property
    def levels(self) -> list[float]:
        return [] if self.level_values is None else self.level_values.tolist()

    @property
    def variable_of_channel(self) -> dict[str, str]:
        """Channel name -> variable name, for every state, diagnostic, forcing and static channel."""
        out = {f"{v}_{lv:g}": v for v in self.names["upper_air"] for lv in self.levels}
        out.update({v: v for role in _OTHER_ROLES for v in self.names.get(role, [])})
        return out

    def close(self) -> None:
        """Close this process's file handles (they reopen on the next read)."""
        for store in self._stores.values():
            store.close()
        self._stores.clear()

    @property
    def grid_shape(self) -> tuple[int, int]:
        return (len(self._lat), len(self._lon))

    @property
    def latitude(self) -> np.ndarray:
        return self._lat

    @property
    def longitude(self) -> np.ndarray:
        return self._lon

    def _channels(self, roles: Sequence[str]) -> list[str]:
        names = [f"{v}_{lv:g}" for v in self.names["upper_air"] for lv in self.levels]
        return names + [v for role in roles for v in self.names[role]]

    @property
    def state_channel_names(self) -> list[str]:
        return self._channels(("surface",))

    @property
    def target_channel_names(self) -> list[str]:
        return self._channels(("surface", "diagnostic"))
