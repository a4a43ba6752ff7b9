"""Map-style PyTorch dataset over ERA5-layout netCDF files and zarr stores (yearly, several roles).

A sample is ``history_len + forecast_len`` consecutive times (the files' uniform time step).
Inputs are the prognostic state over the history, dynamic forcing over all sample times and the
static fields; the target is the prognostic state plus diagnostic variables over the forecast times.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch

from .catalog import TIME_NAME, DataError, FileInfo, parse_period, resolve_glob, scan_file
from .integrity import NONFINITE_MODES, NonFiniteData
from .statistics_files import read_statistics
from .time_index import TIME_ROLES, index_times, select_starts
from .buffers import release, sample_buffer
from .reader import VariableReader

log = logging.getLogger(__name__)

ROLES = ("upper_air", "surface", "forcing", "static", "diagnostic", "mean", "std")


@dataclass(frozen=True)
class VariableSpec:
    """Variable names per role. ``upper_air`` and ``surface`` are prognostic (input and target);
    ``forcing`` and ``static`` are input only; ``diagnostic`` (2-D) is target only."""

    upper_air: tuple[str, ...] = ()
    surface: tuple[str, ...] = ()
    forcing: tuple[str, ...] = ()
    static: tuple[str, ...] = ()
    diagnostic: tuple[str, ...] = ()

    def __post_init__(self):
        for f in fields(self):  # accept lists from configs, store tuples (hashable, immutable)
            value = getattr(self, f.name)
            object.__setattr__(self, f.name, (value,) if isinstance(value, str) else tuple(value))
        names = [v for f in fields(self) for v in getattr(self, f.name)]
        dupes = sorted({v for v in names if names.count(v) > 1})
        if dupes:
            raise DataError(f"variables {dupes} appear in more than one role of the VariableSpec")
        if not self.upper_air and not self.surface:
            raise DataError("VariableSpec needs at least one prognostic (upper_air or surface) variable")


class ERA5Dataset(torch.utils.data.Dataset):
    """Samples of (state history, forcing, static) -> target from ERA5-layout files.

    ``files`` maps each role in ``ROLES`` to a glob relative to ``root``. ``period`` is an inclusive
    (start, end) pair of ISO dates/times; an end at day precision covers that whole day. A sample
    starting at t is valid when all its times lie in the period and exist for every variable;
    samples may span files. ``stride`` keeps every stride-th valid start. File handles are opened
    lazily, once per process (``open_count`` counts them), and reused; construction only scans.
    Raises :class:`DataError` for any mismatch between the configuration and the files, and when
    a variable lacks times the others have in the period (``allow_missing_times``: a warning,
    and those samples are left out). Values read are checked finite: ``nonfinite="error"``
    raises naming the file, variable and time; ``"skip_sample"`` returns the next sample whose
    values are finite instead (its ``skipped`` entry counts the samples passed over).
    ``statistics=False`` (with ``normalize=False``) needs no mean/std files: the catalog and
    the raw reads (:meth:`times_in_period`, :meth:`read_raw`, :meth:`read_static_raw`) serve
    ``credit data stats``, which writes those files.
    """

    def __init__(self, root: str | Path, *, files: Mapping[str, str], variables: VariableSpec,
                 levels: Sequence[float], period: tuple[str, str], history_len: int = 1, forecast_len: int = 1,
                 normalize: bool = True, stride: int = 1, level_dim: str = "level",
                 nonfinite: str = "error", allow_missing_times: bool = False, statistics: bool = True):
        self.root = Path(root)
        if not statistics and normalize:
            raise DataError("normalize=True needs the mean and std files (statistics=True)")
        if nonfinite not in NONFINITE_MODES:
            raise DataError(f"nonfinite={nonfinite!r}; allowed: {list(NONFINITE_MODES)}")
        self.nonfinite, self.allow_missing_times = nonfinite, bool(allow_missing_times)
        self.variables, self.levels = variables, tuple(float(lv) for lv in levels)
        self.history_len, self.forecast_len = int(history_len), int(forecast_len)
        self.normalize, self.level_dim = bool(normalize), level_dim
        unknown = sorted(set(files) - set(ROLES))
        missing = [r for r in ROLES if r not in files]
        if unknown or missing:
            what = "; ".join(s for s in (unknown and f"unknown role(s) {unknown}",
                                         missing and f"missing role(s) {missing}") if s)
            raise DataError(f"files: {what}; the keys must be exactly {list(ROLES)}")
        for name, value in (("history_len", history_len), ("forecast_len", forecast_len), ("stride", stride)):
            if int(value) < 1:
                raise DataError(f"{name} must be >= 1, got {value}")
        if variables.upper_air and not self.levels:
            raise DataError(f"levels is empty but upper-air variables {list(variables.upper_air)} are requested")

        # Scan every distinct file once; roles without variables need no files.
        needed = [r for r in ROLES if (statistics and r in ("mean", "std"))
                  or (r not in ("mean", "std") and getattr(variables, r))]
        self._role_paths = {r: resolve_glob(self.root, r, files[r]) for r in needed}
        self._globs = dict(files)
        self._info: dict[Path, FileInfo] = {}
        for paths in self._role_paths.values():
            for p in paths:
                if p not in self._info:
                    self._info[p] = scan_file(p, level_dim)
        self._check_grid()
        self._where, self._level_idx, self.step_ns = index_times(variables, self._files_with, self.levels, level_dim)
        self._static_info = {v: self._files_with("static", v, ("lat", "lon"))[0] for v in variables.static}
        files_of_role = {role: [self._info[p] for p in self._role_paths.get(role, [])] for role in TIME_ROLES}
        self._starts = select_starts(self._where, self.step_ns, self.history_len, self.forecast_len, variables,
                                     files_of_role, period, int(stride), self.allow_missing_times)
        self._period_ns = parse_period(period)
        if statistics:
            stats = read_statistics(self._role_paths, self._globs, variables, self.levels, level_dim)
            self._state_stats, self._forcing_stats = stats["state"], stats["forcing"]
            self._static_stats, self._target_stats = stats["static"], stats["target"]
        self._reader = VariableReader(self._where, self._level_idx, self.levels, level_dim)
        self._static_cache: np.ndarray | None = None

    # ------------------------------------------------------------------ validation
    def _files_with(self, role: str, var: str, want: tuple[str, ...]) -> list[FileInfo]:
        """Files of ``role`` holding ``var``, each checked to have exactly the dims in ``want``."""
        infos = [self._info[p] for p in self._role_paths[role] if var in self._info[p].dims]
        if not infos:
            searched = [p.name for p in self._role_paths[role]]
            avail = sorted({v for p in self._role_paths[role] for v in self._info[p].dims})
            raise DataError(f"variable {var!r} ({role}) not found in files {searched} matching "
                            f"{self._globs[role]!r} under {self.root}; variables there: {avail}")
        for info in infos:
            dims = {"time": TIME_NAME, "level": self.level_dim, "lat": info.lat_name, "lon": info.lon_name}
            expected = {dims[d] for d in want}
            got = info.dims[var]
            # A static field may carry a length-1 time axis (common in ERA5 invariant files).
            single_time = role == "static" and info.times is not None and len(info.times) == 1
            extra = [d for d in got if d not in expected and not (single_time and d == TIME_NAME)]
            if set(expected) - set(got) or extra:
                raise DataError(f"variable {var!r} in {info.path} has dims {got}; the {role} role needs "
                                f"{tuple(dims[d] for d in want)}")
        return infos

    def _check_grid(self) -> None:
        ref = None
        for role in ("upper_air", "surface", "forcing", "static", "diagnostic"):
            for p in self._role_paths.get(role, []):
                info = self._info[p]
                if info.lat is None or info.lon is None:
                    raise DataError(f"{p} ({role}) has no latitude/longitude coordinate "
                                    f"(looked for latitude/lat and longitude/lon)")
                if ref is None:
                    ref = info
                elif (info.lat.shape != ref.lat.shape or info.lon.shape != ref.lon.shape
                      or not np.allclose(info.lat, ref.lat) or not np.allclose(info.lon, ref.lon)):
                    raise DataError(f"inconsistent grids: {p} has {len(info.lat)}x{len(info.lon)} points "
                                    f"(lat {info.lat[0]:g}..{info.lat[-1]:g}), {ref.path} has "
                                    f"{len(ref.lat)}x{len(ref.lon)} (lat {ref.lat[0]:g}..{ref.lat[-1]:g})")
        self._lat, self._lon = ref.lat.copy(), ref.lon.copy()

    # ---------------------------------------------------------------------- reading
    @property
    def open_count(self) -> int:
        """Files this process has opened (once each; reopened after a fork)."""
        return self._reader.files.open_count

    def close(self) -> None:
        """Close this process's file handles (they reopen on the next read)."""
        self._reader.files.close()

    def times_in_period(self, var: str) -> np.ndarray:
        """The times (int64 ns) of time-dependent `var` inside the period, in order."""
        start, end = self._period_ns
        t = self._where[var][0]
        return t[(t >= start) & (t <= end)]

    def files_of(self, var: str) -> list[Path]:
        """The files `var` is read from inside the period (static: its one file)."""
        if var in self._static_info:
            return [self._static_info[var].path]
        start, end = self._period_ns
        t, infos, fidx, _ = self._where[var]
        return [infos[k].path for k in dict.fromkeys(fidx[(t >= start) & (t <= end)])]

    def read_raw(self, var: str, times: np.ndarray) -> np.ndarray:
        """Un-normalized float32 values of time-dependent `var` at `times` (present in its
        files): (T, levels, H, W) for upper-air variables, else (T, H, W). Raises
        :class:`NonFiniteData` naming the file, variable and time of a NaN or inf."""
        times = np.asarray(times, np.int64)
        upper = var in self.variables.upper_air
        out = np.empty((len(times), *((len(self.levels),) if upper else ()), *self.grid_shape), np.float32)
        self._reader.read_into(var, times, upper, [out[i] if upper else out[i][None] for i in range(len(times))])
        return out

    def read_static_raw(self, var: str) -> np.ndarray:
        """Un-normalized float32 (H, W) values of static `var`."""
        return self._reader.read_static(var, self._static_info[var])

    def _norm(self, x: np.ndarray, stats: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """`(x - mean) / std` per channel (axis -3), in place: `x` is a buffer of this sample."""
        if not self.normalize:
            return x
        mean, std = (s.astype(np.float32) for s in stats)
        for c in range(x.shape[-3]):  # one channel at a time: its second pass reads cache, not memory
            x[..., c, :, :] -= mean[c]
            x[..., c, :, :] /= std[c]
        return x

    def _static(self) -> np.ndarray:
        if self._static_cache is None:  # plain data: safe to inherit across a fork
            arrays = []
            for var in self._static_info:
                try:
                    arrays.append(self.read_static_raw(var))
                except NonFiniteData as error:  # not NonFiniteData: no sample could be kept
                    raise DataError(f"{str(error).split(';')[0]}; a static field enters every sample, "
                                    f"so data.nonfinite=skip_sample cannot help") from None
            h, w = self.grid_shape
            stacked = np.stack(arrays) if arrays else np.zeros((0, h, w), np.float32)
            self._static_cache = self._norm(stacked, self._static_stats)
        return self._static_cache

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        n_samples = len(self._starts)
        if not -n_samples <= index < n_samples:
            raise IndexError(f"sample index {index} out of range for {n_samples} samples")
        index = int(index) % n_samples
        if self.nonfinite == "error":
            return {**self._sample(index), "skipped": torch.tensor(0)}
        for skipped in range(n_samples):
            try:
                sample = self._sample((index + skipped) % n_samples)
            except NonFiniteData as error:
                log.warning("skipping sample %d: %s", (index + skipped) % n_samples, str(error).split(";")[0])
                continue
            return {**sample, "skipped": torch.tensor(skipped)}
        raise DataError("every sample of the period reads non-finite values (data.nonfinite=skip_sample)")

    def _sample(self, index: int) -> dict[str, torch.Tensor]:
        """One sample, each variable read once into the sample's buffers (straight from the file
        where it is plain float32, else with one copy), normalized in place."""
        spec, h, f = self.variables, self.history_len, self.forecast_len
        times = self._starts[index] + self.step_ns * np.arange(h + f)
        buffers = {
            "state": sample_buffer((h, len(self.state_channel_names), *self.grid_shape)),
            "forcing": sample_buffer((h + f, len(spec.forcing), *self.grid_shape)),
            "static": sample_buffer((len(spec.static), *self.grid_shape)),
            "target": sample_buffer((f, len(self.target_channel_names), *self.grid_shape)),
        }
        try:
            self._fill(times, *(buffers[key].numpy() for key in ("state", "forcing", "static", "target")))
        except BaseException:
            release(list(buffers.values()))  # never handed on (e.g. non-finite): reusable at once
            raise
        return {**buffers, "time": torch.from_numpy(times.astype(np.int64)),
                "index": torch.tensor(index, dtype=torch.int64)}

    def _fill(self, times: np.ndarray, state: np.ndarray, forcing: np.ndarray, static: np.ndarray,
              target: np.ndarray) -> None:
        spec, h, f = self.variables, self.history_len, self.forecast_len
        channel = 0
        for var in spec.upper_air + spec.surface:
            upper = var in spec.upper_air
            width = len(self.levels) if upper else 1
            dests = [*(state[i, channel:channel + width] for i in range(h)),
                     *(target[i, channel:channel + width] for i in range(f))]
            self._reader.read_into(var, times, upper, dests)
            channel += width
        for var in spec.diagnostic:
            self._reader.read_into(var, times[h:], False, [target[i, channel:channel + 1] for i in range(f)])
            channel += 1
        for k, var in enumerate(spec.forcing):
            self._reader.read_into(var, times, False, [forcing[i, k:k + 1] for i in range(h + f)])
        self._norm(state, self._state_stats)
        self._norm(forcing, self._forcing_stats)
        self._norm(target, self._target_stats)
        static[...] = self._static()

    # ------------------------------------------------------------------- metadata
    def _channels(self, upper: Sequence[str], flat: Sequence[str]) -> list[str]:
        return [f"{v}_{lv:g}" for v in upper for lv in self.levels] + list(flat)

    @property
    def state_channel_names(self) -> list[str]:
        return self._channels(self.variables.upper_air, self.variables.surface)

    @property
    def target_channel_names(self) -> list[str]:
        return self.state_channel_names + list(self.variables.diagnostic)

    @property
    def forcing_channel_names(self) -> list[str]:
        return list(self.variables.forcing)

    @property
    def static_channel_names(self) -> list[str]:
        return list(self.variables.static)

    @property
    def variable_of_channel(self) -> dict[str, str]:
        """Channel name -> variable name, for every state, diagnostic, forcing and static channel."""
        out = {f"{v}_{lv:g}": v for v in self.variables.upper_air for lv in self.levels}
        spec = self.variables
        out.update({v: v for v in spec.surface + spec.diagnostic + spec.forcing + spec.static})
        return out

    @property
    def target_channel_groups(self) -> dict[str, list[int]]:
        """Variable -> indices of its channels in ``target`` (e.g. for per-variable RMSE)."""
        groups: dict[str, list[int]] = {}
        for i, name in enumerate(self.target_channel_names):
            groups.setdefault(self.variable_of_channel[name], []).append(i)
        return groups

    @property
    def grid_shape(self) -> tuple[int, int]:
        return len(self._lat), len(self._lon)

    @property
    def latitude(self) -> np.ndarray:
        """Latitudes [degrees] in the files' order (ERA5: descending)."""
        return self._lat.copy()

    @property
    def longitude(self) -> np.ndarray:
        return self._lon.copy()

    @property
    def times(self) -> np.ndarray:
        """Start (first history) time of every sample, datetime64[ns]."""
        return self._starts.astype("datetime64[ns]")

    output_inverse = None  # no pointwise transform to undo on de-normalised outputs (CREDIT's gen2 data have)
    computed_output = None  # no variable computed from the outputs for the loss (CREDIT's gen2 data may have)

    @property
    def target_mean(self) -> np.ndarray:
        return self._target_stats[0].astype(np.float32)

    @property
    def target_std(self) -> np.ndarray:
        return self._target_stats[1].astype(np.float32)
