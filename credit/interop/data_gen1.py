"""CREDIT's gen1 ERA5 files, read as CREDIT's gen1 dataset reads them.

The files are CREDIT's as they are: yearly netCDF files or zarr stores (one per year, the
year in the name) holding the upper-air variables on (time, level, latitude, longitude) and the
surface, dynamic-forcing and diagnostic variables on (time, latitude, longitude), possibly all
in one file; one static file; one forcing file covering a leap year, matched to each input
time by (month, day, hour); mean and std files with the upper-air variables on `level`.

A sample holds, for one start time `s` inside one yearly file (CREDIT's samples never cross a
year file), CREDIT's arithmetic exactly:

- input frames at `s, s + k, s + 2k, ... < s + history_len` (`history_len` counts file steps,
  `k` = `skip_periods`), target(s) at `s + history_len + t` for each forecast step t;
- state channels: each upper-air variable over the file's levels (variable-major), then the
  surface variables, z-scored with the mean/std files in the arithmetic's common dtype (float64
  for float64 statistics), then cast to float32;
- the forcing block per frame: dynamic forcing (z-scored), forcing and static variables (as
  stored), in CREDIT's `static_first` order; it travels as the sample's `forcing` (the static
  fields are in it, so `static` has no channels) and `credit.models.inputs.credit_input`
  appends it to the state exactly as CREDIT's trainer does;
- target channels: upper-air, surface, diagnostic; `clamp` bounds every value afterwards.

Unlike CREDIT's batcher, the sample index space holds each valid start once (CREDIT's also
holds duplicates of each file's last start) and a yearly file is chosen by the year in its name,
not by a substring of the whole path.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from credit.data.catalog import LAT_NAMES, LON_NAMES, DataError, open_store, parse_period
from credit.data.statistics_files import first_unusable
from credit.interop.layout import CreditLayout, iso, warn_once

FILE_ROLES = ("upper_air", "surface", "dynamic_forcing", "diagnostic")  # yearly files, paired by year
_YEAR = re.compile(r"(?<!\d)(\d{4})(?!\d)")


def layout_role_files(root: str | Path, pattern: str | None, role: str) -> list[Path]:
    """The files of one CREDIT glob (relative to `root` or absolute); DataError when none."""
    found = _paths(Path(root), pattern) if pattern else []
    if not found:
        raise DataError(f"the CREDIT files of {role} ({pattern!r}) match no file")
    return found


def _paths(root: Path, pattern: str) -> list[Path]:
    full = pattern if Path(pattern).is_absolute() else str(root / pattern)
    return sorted(Path(p) for p in glob.glob(full))


def file_year(path: Path) -> int | None:
    """The year a gen1 file's name holds: its last group of exactly four digits."""
    years = _YEAR.findall(path.name)
    return int(years[-1]) if years else None


def _normalize(values: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """(values - mean) / std in the dtype numpy (and so xarray, CREDIT's path) promotes the
    three to, cast to float32 once at the end."""
    dtype = np.result_type(values.dtype, mean.dtype, std.dtype)
    return ((values.astype(dtype, copy=False) - mean.astype(dtype)) / std.astype(dtype)).astype(np.float32)


class CreditGen1Dataset(CreditLayout, torch.utils.data.Dataset):
    """Samples of CREDIT's gen1 ERA5 files whose times all lie in `period` (inclusive ISO
    start, end; an end at day precision covers that day), from the yearly files of its years.

    `files` maps `upper_air`, `surface`, `dynamic_forcing`, `diagnostic` to globs of yearly
    files, `forcing` and `static` to one file each, `mean` and `std` to the statistics files
    (relative to `root` or absolute; a role without variables needs no entry).
    `forecast_len` counts target steps (CREDIT's `forecast_len` + 1). Raises
    :class:`DataError` naming the file or variable for any mismatch with the files.
    """

    def __init__(self, root: str | Path, *, files: Mapping[str, str | None], upper_air: Sequence[str],
                 surface: Sequence[str], dynamic_forcing: Sequence[str], forcing: Sequence[str],
                 static: Sequence[str], diagnostic: Sequence[str], levels: Sequence[float],
                 period: tuple[str, str], history_len: int = 1, forecast_len: int = 1, skip_periods: int = 1,
                 static_first: bool = True, clamp: Sequence[float] | None = None):
        self.root = Path(root)
        self.names = dict(upper_air=list(upper_air), surface=list(surface), dynamic_forcing=list(dynamic_forcing),
                          forcing=list(forcing), static=list(static), diagnostic=list(diagnostic))
        if not self.names["upper_air"] and not self.names["surface"]:
            raise DataError("CREDIT's data needs upper-air (`variables`) or `surface_variables`")
        if history_len < 1 or forecast_len < 1 or skip_periods < 1:
            raise DataError(f"history_len={history_len}, forecast_len={forecast_len} (target steps) and "
                            f"skip_periods={skip_periods} must be >= 1")
        if skip_periods > 1 and forecast_len > 1:
            raise DataError("skip_periods > 1 with forecast_len > 0: CREDIT itself calls this combination "
                            "unstable (its next step starts one file step later, not skip_periods); use one")
        self.history_len, self.forecast_len, self.skip = history_len, forecast_len, skip_periods
        self.static_first = bool(static_first)
        self.clamp = None if clamp is None else (float(clamp[0]), float(clamp[1]))
        self.period = parse_period(tuple(period))
        years = tuple(int(str(np.datetime64(t, "ns").astype("datetime64[Y]"))) for t in self.period)
        self.files = {role: self._role_files(files, role, years) for role in FILE_ROLES if self.names[role]}
        counts = {role: [p.name for p in paths] for role, paths in self.files.items()}
        first = next(iter(self.files.values()))
        for role, paths in self.files.items():
            if [file_year(p) for p in paths] != [file_year(p) for p in first]:
                raise DataError(f"the yearly files of {role} ({counts[role]}) and of the upper-air variables "
                                f"({[p.name for p in first]}) hold different years")
        self._stores: dict[Path, object] = {}
        self._scan(levels)
        self._forcing_index, self._forcing_path = self._scan_forcing(files)
        self._static_path = self._single(files, "static") if self.names["static"] else None
        self._static_values = None
        self.check_static(self._static_path)
        self._load_statistics(files)
        start, end = self.period
        self._starts = [(f, s) for f, times in enumerate(self._file_times) for s in range(len(times) - self._window())
                        if times[s] >= start and times[s + self._window()] <= end]
        if not self._starts:
            raise DataError(f"no sample fits in period {list(period)}: a sample needs history_len + forecast_len "
                            f"- 1 = {self._window()} more times after its start, in the same yearly file")
        for role, paths in self.files.items():  # a chunk a sample reads missing: one error, before any sample
            for f, path in enumerate(paths):
                for var in self.names[role]:
                    self.check_store_complete(path, var, self._file_times[f], self.period)
        self._static()  # its values checked here, before any sample

    # ------------------------------------------------------------------ files
    def _role_files(self, files: Mapping[str, str | None], role: str, years: tuple[int, int]) -> list[Path]:
        pattern = files.get(role)
        if not pattern:
            raise DataError(f"the {role} variables {self.names[role]} have no files: set their save_loc glob")
        found = _paths(self.root, pattern)
        if not found:
            raise DataError(f"files[{role!r}] = {pattern!r} matches no file")
        chosen = [p for p in found if (y := file_year(p)) is not None and years[0] <= y <= years[1]]
        if not chosen:
            raise DataError(f"files[{role!r}] = {pattern!r}: no file name holds a year in {years[0]}-{years[1]} "
                            f"(found {[p.name for p in found[:4]]}{' ...' if len(found) > 4 else ''})")
        return chosen

    def _single(self, files: Mapping[str, str | None], role: str) -> Path:
        pattern = files.get(role)
        found = _paths(self.root, pattern) if pattern else []
        if len(found) != 1:
            raise DataError(f"files[{role!r}] = {pattern!r} must name one file; it matches {len(found)}")
        return found[0]

    def _store(self, path: Path):
        if path not in self._stores:
            self._stores[path] = open_store(path, cache=False)
        return self._stores[path]

    def _scan(self, levels: Sequence[float]) -> None:
        self._file_times = []
        for i, path in enumerate(self.files[next(iter(self.files))]):
            times = None
            for role, paths in self.files.items():
                ds = self._store(paths[i])
                for var in self.names[role]:
                    if var not in ds.data_vars:
                        raise DataError(f"{paths[i]} has no variable {var!r} ({role}); it holds {sorted(ds.data_vars)}")
                t = ds["time"].values.astype("datetime64[ns]").astype(np.int64)
                if times is None:
                    times = t
                elif not np.array_equal(t, times):
                    raise DataError(f"{paths[i]} and {path} hold different times; CREDIT pairs them step by step")
            _warn_uneven(path, times)
            self._file_times.append(times)
        ds = self._store(self.files[next(iter(self.files))][0])
        self.lat_name = next((n for n in LAT_NAMES if n in ds.coords or n in ds.dims), None)
        self.lon_name = next((n for n in LON_NAMES if n in ds.coords or n in ds.dims), None)
        if self.lat_name is None or self.lon_name is None:
            raise DataError(f"{self.files[next(iter(self.files))][0]} has no latitude/longitude coordinate")
        self._lat = np.asarray(ds[self.lat_name].values)
        self._lon = np.asarray(ds[self.lon_name].values)
        self.level_values = None
        if self.names["upper_air"]:
            file_levels = np.asarray(self._store(self.files["upper_air"][0])["level"].values, dtype=np.float64)
            if not np.array_equal(file_levels, np.asarray(levels, dtype=np.float64)):
                raise DataError(f"data.levels {list(levels)} differ from the level coordinate "
                                f"{file_levels.tolist()} of {self.files['upper_air'][0]} (CREDIT reads the "
                                "levels in file order)")
            self.level_values = file_levels
        steps = np.unique(np.diff(self._file_times[0])) if len(self._file_times[0]) > 1 else np.array([0])
        self.step_ns = int(steps[0])

    def _scan_forcing(self, files: Mapping[str, str | None]):
        if not self.names["forcing"]:
            return None, None
        path = self._single(files, "forcing")
        ds = self._store(path)
        for var in self.names["forcing"]:
            if var not in ds.data_vars:
                raise DataError(f"{path} has no forcing variable {var!r}; it holds {sorted(ds.data_vars)}")
        index: dict[tuple[int, int, int], int] = {}
        times = ds["time"].values.astype("datetime64[ns]")
        for i, key in enumerate(_month_day_hour(times)):
            index.setdefault(key, i)
        return index, path

    def _load_statistics(self, files: Mapping[str, str | None]) -> None:
        mean_path, std_path = self._single(files, "mean"), self._single(files, "std")
        normalized = ("upper_air", "surface", "dynamic_forcing", "diagnostic")
        self._mean, self._std = {}, {}
        for path, table in ((mean_path, self._mean), (std_path, self._std)):
            ds = open_store(path, cache=False)
            for role in normalized:
                for var in self.names[role]:
                    if var not in ds.data_vars:
                        raise DataError(f"{path} has no statistic for {var!r} ({role}); CREDIT's mean_path and "
                                        f"std_path hold every upper-air, surface, dynamic-forcing and diagnostic "
                                        "variable")
                    values = np.asarray(ds[var].values)
                    where = first_unusable(values, table is self._std)
                    if where is not None:
                        level = (f" at level {ds[var]['level'].values[where[0]]:g}"
                                 if role == "upper_air" and "level" in ds[var].dims else "")
                        raise DataError(f"{path}: the {'std' if table is self._std else 'mean'} of {var!r}{level} is "
                                        f"{float(np.atleast_1d(values)[where])}; it must be finite"
                                        f"{' and > 0 (the values are divided by it)' * (table is self._std)}")
                    if role == "upper_air":
                        stat_levels = np.asarray(ds[var]["level"].values, dtype=np.float64)
                        if not np.array_equal(stat_levels, self.level_values):
                            raise DataError(f"{path}: {var} is on levels {stat_levels.tolist()}, the data on "
                                            f"{self.level_values.tolist()}")
                        values = values.reshape(-1, 1, 1)
                    table[var] = values
            ds.close()

    # ------------------------------------------------------------------ samples
    def _window(self) -> int:
        """Times after a start that a sample needs: the last target's offset."""
        return self.history_len + self.forecast_len - 1

    @property
    def input_frames(self) -> int:
        return len(range(0, self.history_len, self.skip))

    def __len__(self) -> int:
        return len(self._starts)

    def sample_times(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(input times, target times) of a sample, int64 ns."""
        f, s = self._starts[index]
        times = self._file_times[f]
        inputs = times[s + np.arange(0, self.history_len, self.skip)]
        targets = times[s + self.history_len + np.arange(self.forecast_len)]
        return inputs, targets

    def _offsets(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        inputs = np.arange(0, self.history_len, self.skip)
        targets = self.history_len + np.arange(self.forecast_len)
        # the forcing of every frame a forecast step's window reads: with skip 1 the inputs and
        # targets are contiguous; otherwise (one target step) the target follows the inputs
        forcing = np.arange(self.input_frames + self.forecast_len) if self.skip == 1 else np.append(inputs, targets)
        return inputs, targets, forcing

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"sample index {index} out of range for {len(self)} samples")
        f, s = self._starts[int(index) % len(self)]
        inputs, targets, forcing = self._offsets()
        state = self._state(f, s + inputs, with_diagnostic=False)
        target = self._state(f, s + targets, with_diagnostic=True)
        block = self._forcing_block(f, s + forcing)
        if self.clamp is not None:
            for array in (state, target, block):
                np.clip(array, *self.clamp, out=array)
        times = self._file_times[f]
        return {"state": torch.from_numpy(state), "forcing": torch.from_numpy(block),
                "static": torch.zeros((0, *self.grid_shape)), "target": torch.from_numpy(target),
                "time": torch.from_numpy(times[s + np.append(inputs, targets)].astype(np.int64)),
                "index": torch.tensor(int(index), dtype=torch.int64), "skipped": torch.tensor(0)}

    def _read(self, role: str, f: int, var: str, rows: np.ndarray) -> np.ndarray:
        path = self.files[role][f]
        self.check_stored(path, var, rows, self._file_times[f][rows])
        values = np.asarray(self._store(path)[var].isel(time=rows).values)
        return self.check_finite(values, var, path, self._file_times[f][rows],
                                 self.level_values if role == "upper_air" else None)

    def _state(self, f: int, rows: np.ndarray, with_diagnostic: bool) -> np.ndarray:
        parts = [_normalize(self._read("upper_air", f, v, rows), self._mean[v], self._std[v])
                 for v in self.names["upper_air"]]
        parts = [p.reshape(len(rows), -1, *self.grid_shape) for p in parts]
        roles = ("surface", "diagnostic") if with_diagnostic else ("surface",)
        for role in roles:
            parts += [_normalize(self._read(role, f, v, rows), self._mean[v], self._std[v])[:, None]
                      for v in self.names[role]]
        return np.concatenate(parts, axis=1)

    def _forcing_block(self, f: int, rows: np.ndarray) -> np.ndarray:
        n = len(rows)
        dynamic = [_normalize(self._read("dynamic_forcing", f, v, rows), self._mean[v], self._std[v])[:, None]
                   for v in self.names["dynamic_forcing"]]
        forcing = []
        if self.names["forcing"]:
            times = self._file_times[f][rows].astype("datetime64[ns]")
            try:
                at = np.array([self._forcing_index[key] for key in _month_day_hour(times)])
            except KeyError as missing:
                raise DataError(f"{self._forcing_path} has no time at (month, day, hour) {missing.args[0]}; "
                                "CREDIT's forcing file covers one leap year at the data's time step") from None
            ds = self._store(self._forcing_path)
            forcing = [np.asarray(ds[v].isel(time=at).values, dtype=np.float32)[:, None] for v in self.names["forcing"]]
        static = [np.broadcast_to(s, (n, 1, *self.grid_shape)) for s in self._static()]
        order = static + dynamic + forcing if self.static_first else dynamic + forcing + static
        if not order:
            return np.zeros((n, 0, *self.grid_shape), dtype=np.float32)
        return np.ascontiguousarray(np.concatenate(order, axis=1), dtype=np.float32)

    def _static(self) -> list[np.ndarray]:
        if self._static_values is None:
            values = []
            if self._static_path is not None:
                ds = self._store(self._static_path)
                for var in self.names["static"]:
                    if var not in ds.data_vars:
                        raise DataError(f"{self._static_path} has no static variable {var!r}; it holds "
                                        f"{sorted(ds.data_vars)}")
                    field = np.asarray(ds[var].values, dtype=np.float32).reshape(self.grid_shape)
                    values.append(self.check_finite(field[None], var, self._static_path, None, None)[0])
            self._static_values = values
        return self._static_values

    # ------------------------------------------------------------------ layout
    normalize = True  # CREDIT's std_new: values are z-scored with the mean/std files
    output_inverse = None  # gen1 has no pointwise output blocks
    computed_output = None  # nor computed diagnostics

    @property
    def times(self) -> np.ndarray:
        """First input time of every sample, datetime64[ns]."""
        return np.array([self._file_times[f][s] for f, s in self._starts], dtype=np.int64).astype("datetime64[ns]")

    @property
    def forcing_channel_names(self) -> list[str]:
        order = ("static", "dynamic_forcing", "forcing") if self.static_first else ("dynamic_forcing", "forcing",
                                                                                     "static")
        return [v for role in order for v in self.names[role]]

    def _stat(self, table: dict[str, np.ndarray]) -> np.ndarray:
        values = [table[v].reshape(-1) for v in self.names["upper_air"]]
        values += [table[v].reshape(1) for role in ("surface", "diagnostic") for v in self.names[role]]
        return np.concatenate(values).astype(np.float64)

    @property
    def target_mean(self) -> np.ndarray:
        return self._stat(self._mean)

    @property
    def target_std(self) -> np.ndarray:
        return self._stat(self._std)


def _warn_uneven(path: Path, times: np.ndarray) -> None:
    """One warning when a file's times are not evenly spaced (a gap, a repeated time): CREDIT's
    gen1 reader pairs them by position, and so does this one, so a sample across it spans
    other intervals than the rest."""
    steps = np.diff(times)
    if not len(steps) or (steps == steps[0]).all():
        return
    usual = int(np.median(steps))
    odd = int(np.flatnonzero(steps != usual)[0])
    warn_once(f"{path}: its times are not evenly spaced ({int(steps[odd]) / 3.6e12:g} h after {iso(int(times[odd]))}, "
              f"{usual / 3.6e12:g} h elsewhere); CREDIT's gen1 reader pairs time steps by position, and so does this "
              "run: a sample across it spans other intervals than the rest")


def _month_day_hour(times: np.ndarray) -> list[tuple[int, int, int]]:
    months = times.astype("datetime64[M]").astype(int) % 12 + 1
    days = (times.astype("datetime64[D]") - times.astype("datetime64[M]")).astype(int) + 1
    hours = (times.astype("datetime64[h]") - times.astype("datetime64[D]")).astype(int)
    return list(zip(months.tolist(), days.tolist(), hours.tolist()))
