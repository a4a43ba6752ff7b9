"""CREDIT's gen2 ERA5 files (`data.source.ERA5`), read as CREDIT's gen2 dataset and its
`era5_normalizer` and `concat` preblocks read them.

Files: one path template per field type (prognostic, dynamic forcing, static, diagnostic) whose
strftime codes (`%Y`, ...) are globbed; a template matching one file serves every time, several
files each serve the period their name's date spells (a `%Y` file: its year). Times are read
exactly (`sel(time=t)`); a 3-D variable's levels are picked nearest to the configured ones, in
the configured order; a static file's time axis, if any, is dropped at its first entry.

A sample starts at an init time `t0` of the master clock, `start + (history_len - 1) dt` ...
`end - forecast_len dt` every `dt` (both ends inclusive, so a sample's last target may be the
period's end), and may cross year files:

- state frames at `t0 - (history_len - 1) dt ... t0`: each prognostic 3-D variable over the
  levels (variable-major), then the prognostic 2-D ones;
- targets at `t0 + dt ... t0 + forecast_len dt`: the state channels, then the diagnostic ones;
- the forcing block at every input and target time: static, then dynamic forcing (CREDIT's
  gen2 order); it travels as the sample's `forcing` (`credit.models.inputs.credit_input`
  appends it to each frame's state as CREDIT's concat preblock does).

Normalisation is the normaliser's float32 arithmetic: `(x - mean) / max(std, 1e-12)` with the
statistics of the variable's bare name in both files (static and dynamic forcing too); a
variable missing from either file passes through as stored. A 3-D variable's statistics are
matched by position (`stats_levels`, 1-indexed, or the file's whole level axis), not by level
value, as CREDIT matches them. With a bridgescaler file instead (CREDIT's
`bridgescaler_transform` preblock, `bridgescaler_file`), the `scaled` variables take
`(x - mean) / sqrt(var)` in float32, inputs with the file's input scalers and targets with its
target scalers, one per level in the data's level order (one per grid point for the `spatial`
2-D variables, CREDIT's `spatial_variables`); the others pass through as stored.
Forecasts are de-normalised with the target scalers of `bridgescaler_inverse` (CREDIT's inverse
postblocks' file) when it is given.
`clamp` bounds every value afterwards.

Hand-written rather than a generic xarray multi-file open: each sample reads a handful of exact
times from the one file that holds each, which `open_mfdataset` would index across every file.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from credit.data.catalog import LAT_NAMES, LON_NAMES, DataError, open_store, parse_period
from credit.interop.data_gen2_values import Gen2Values
from credit.interop.geopotential import ComputedGeopotential
from credit.interop.layout import CreditLayout, iso, warn_once
from credit.interop.path_templates import template_files
from credit.interop.pointwise_blocks import blocks
from credit.interop.tisr import SolarSource

ROLES = ("prognostic", "dynamic_forcing", "static", "diagnostic")


class CreditGen2Dataset(Gen2Values, CreditLayout, torch.utils.data.Dataset):
    """Samples of CREDIT's gen2 files whose init times lie on the master clock of `period`
    (ISO start, end; an end at day precision covers that day) every `timestep`.

    `files` maps `prognostic`, `dynamic_forcing`, `static`, `diagnostic` to path templates
    and `mean`, `std` to the normaliser's files (relative to `root` or absolute). `levels`
    are picked nearest in the files' `level_coord` (None: the files' levels in file order);
    `stats_levels` are the normaliser's 1-indexed positions on the statistics' level axis.
    `files["bridgescaler"]`, when given, replaces the mean and std files: the bridgescaler
    file's scalers of `source_name`'s `scaled` variables (bare names; None: every variable the
    file has a scaler for); the `spatial` ones (2-D) have one statistic per grid point.
    `transforms` (CREDIT's log and sqrt preblocks, credit/interop/pointwise_blocks.py) act on
    the values as read, before normalising; `output_inverse` (its exp and square postblocks)
    is what `output_inverse` applies to de-normalised outputs.
    `forecast_len` counts target steps, as CREDIT's gen2 does. Raises :class:`DataError`
    naming the file, variable or time of any mismatch with the files.
    """

    normalize = True  # the values are the normaliser's; rollout de-normalises with target_mean/std

    def __init__(self, root: str | Path, *, files: Mapping[str, str | None], prognostic_3d: Sequence[str],
                 prognostic_2d: Sequence[str], dynamic_forcing: Sequence[str], static: Sequence[str],
                 diagnostic: Sequence[str], levels: Sequence[float] | None, period: tuple[str, str],
                 timestep: str, level_coord: str = "level", stats_levels: Sequence[int] | None = None,
                 history_len: int = 1, forecast_len: int = 1, clamp: Sequence[float] | None = None,
                 source_name: str = "ERA5", scaled: Sequence[str] | None = None, spatial: Sequence[str] = (),
                 transforms: Sequence[Mapping] = (), output_inverse: Sequence[Mapping] = (),
                 solar: SolarSource | None = None, geopotential: Mapping | None = None):
        self.root = Path(root)
        self.solar = solar
        self.names = dict(upper_air=list(prognostic_3d), surface=list(prognostic_2d),
                          dynamic_forcing=list(dynamic_forcing), static=list(static), diagnostic=list(diagnostic))
        if not self.names["upper_air"] and not self.names["surface"]:
            raise DataError("CREDIT's gen2 data needs prognostic variables (vars_3D or vars_2D)")
        if history_len < 1 or forecast_len < 1:
            raise DataError(f"history_len={history_len} and forecast_len={forecast_len} must be >= 1")
        self.history_len, self.forecast_len = int(history_len), int(forecast_len)
        self.level_coord = level_coord
        self.clamp = None if clamp is None else (float(clamp[0]), float(clamp[1]))
        try:
            self.step_ns = int(pd.Timedelta(timestep).value)
        except ValueError as err:
            raise DataError(f"timestep {timestep!r} is not a time span (e.g. '6h'): {err}") from None
        if self.step_ns <= 0:
            raise DataError(f"timestep {timestep!r} must be positive")
        self.spatial = list(spatial)
        self._transforms = blocks(transforms)
        self._inverse_entries = [dict(e) for e in output_inverse]
        self._stores: dict[Path, object] = {}
        self._time_rows: dict[Path, dict[int, int]] = {}
        self.files = {role: self._role_files(files, role) for role in ("prognostic", "dynamic_forcing", "diagnostic")
                      if self._has(role)}
        self._static_path = self._role_files(files, "static")[0][0] if self.names["static"] else None
        self._scan_grid(levels)
        if solar is not None and solar.grid_shape != tuple(self.grid_shape):
            raise DataError(f"data.source.{solar.name} (dataset_type: tisr) computes {solar.variable} on a "
                            f"{solar.grid_shape[0]}x{solar.grid_shape[1]} grid (lat_spec x lon_spec, or its grid "
                            f"file); the data's grid is {self.grid_shape[0]}x{self.grid_shape[1]}: CREDIT "
                            "concatenates the sources' fields, so they must be one grid")
        self.check_static(self._static_path, drop="time")
        if files.get("bridgescaler"):
            self._mean, self._std, self._target_mean, self._target_std = self._load_bridgescaler(
                files["bridgescaler"], source_name, scaled, ("input", "target"))
            self._output_mean, self._output_std = self._target_mean, self._target_std
            if files.get("bridgescaler_inverse") and files["bridgescaler_inverse"] != files["bridgescaler"]:
                self._output_mean, self._output_std = self._load_bridgescaler(
                    files["bridgescaler_inverse"], source_name, scaled, ("target",))
        else:
            self._load_statistics(files, stats_levels)
            self._target_mean, self._target_std = self._output_mean, self._output_std = self._mean, self._std
        if solar is not None and solar.variable not in self._mean:
            warn_once(f"{solar.variable} (data.source.{solar.name}, computed) has no statistics in the normaliser's "
                      "files: it enters the model in J m-2 (up to about 1e7 per hour of time step), as in CREDIT")
        self._static_values: np.ndarray | None = None
        start, end = parse_period(tuple(period))
        first = start + (self.history_len - 1) * self.step_ns
        last = end - self.forecast_len * self.step_ns
        self._inits = np.arange(first, last + 1, self.step_ns, dtype=np.int64) if last >= first else \
            np.zeros(0, np.int64)
        if len(self._inits) == 0:
            raise DataError(f"no sample fits in period {list(period)}: a sample needs history_len - 1 = "
                            f"{self.history_len - 1} steps before its init and forecast_len = {self.forecast_len} "
                            f"after it, every {timestep}")
        self._check_stores_complete()
        if solar is not None:  # every forcing time of every sample
            solar.check_years(int(self._inits[0]) - (self.history_len - 1) * self.step_ns,
                              int(self._inits[-1]) + self.forecast_len * self.step_ns)
        if self.names["static"]:
            self._static()  # its values checked here, before any sample
        self.computed_output = None if geopotential is None else self._computed_geopotential(
            geopotential, files.get("bridgescaler_inverse") or files.get("bridgescaler"))

    def _check_stores_complete(self) -> None:
        """Before any sample, one error for a time a sample reads that no file holds (a gap,
        a file cut short, a time coordinate that is not dates) or a zarr chunk it lacks."""
        needed = (int(self._inits[0]) - (self.history_len - 1) * self.step_ns,
                  int(self._inits[-1]) + self.forecast_len * self.step_ns)
        every = np.arange(needed[0], needed[1] + 1, self.step_ns, dtype=np.int64)
        roles = {"prognostic": self.names["upper_air"] + self.names["surface"],
                 "dynamic_forcing": self._file_forcing, "diagnostic": self.names["diagnostic"]}
        for role, entries in self.files.items():
            held = np.zeros(len(every), dtype=bool)
            for path, start, end in entries:
                coord = self._store(path)["time"].values
                times = coord.astype("datetime64[ns]").astype(np.int64)
                mine = (every >= start) & (every <= end) & ~held
                self._check_times_held(path, coord, times, every[mine])
                held |= mine
                for var in roles[role]:
                    self.check_store_complete(path, var, times, needed)
            if not held.all():
                self._file_at(role, int(every[~held][0]))  # names the time and the files

    @staticmethod
    def _check_times_held(path: Path, coord: np.ndarray, times: np.ndarray, wanted: np.ndarray) -> None:
        missing = wanted[~np.isin(wanted, times)]
        if not len(missing):
            return
        kind = "" if np.issubdtype(coord.dtype, np.datetime64) else f" (its time coordinate holds {coord.dtype} " \
                                                                     "values, not dates)"
        span = f"{iso(int(times.min()))} to {iso(int(times.max()))}" if len(times) else "none"
        raise DataError(f"{path} lacks {len(missing)} of the {len(wanted)} times the samples read, the first "
                        f"{iso(int(missing[0]))}; it holds {len(times)} times, {span}{kind}. CREDIT reads every "
                        "sample time exactly: complete the file, or narrow start_datetime / end_datetime")

    # ------------------------------------------------------------------ files
    def _has(self, role: str) -> bool:
        if role == "prognostic":
            return bool(self.names["upper_air"] or self.names["surface"])
        return bool(self._file_forcing if role == "dynamic_forcing" else self.names[role])

    @property
    def _file_forcing(self) -> list[str]:
        """The dynamic forcing read from files (a `tisr` source's is computed)."""
        computed = self.solar.variable if self.solar is not None else None
        return [v for v in self.names["dynamic_forcing"] if v != computed]

    def _role_files(self, files: Mapping[str, str | None], role: str) -> list[tuple[Path, int, int]]:
        template = files.get(role)
        if not template:
            raise DataError(f"the {role} variables have no path: set data.source.ERA5.variables.{role}.path")
        found = template_files(self.root, template)
        if not found:
            raise DataError(f"the {role} path {template!r} matches no file")
        return found

    def _store(self, path: Path):
        if path not in self._stores:
            self._stores[path] = open_store(path, cache=False)
        return self._stores[path]

    def _file_at(self, role: str, t: int) -> Path:
        spans = self.files[role]
        i = bisect.bisect_right([s for _, s, _ in spans], t) - 1
        if i < 0 or t > spans[i][2]:
            raise DataError(f"no {role} file holds {iso(t)} ({[p.name for p, _, _ in spans[:3]]}"
                            f"{' ...' if len(spans) > 3 else ''})")
        return spans[i][0]

    def _row(self, path: Path, t: int) -> int:
        if path not in self._time_rows:
            times = self._store(path)["time"].values.astype("datetime64[ns]").astype(np.int64)
            self._time_rows[path] = {int(v): i for i, v in enumerate(times)}
        row = self._time_rows[path].get(int(t))
        if row is None:
            raise DataError(f"{path} has no time {iso(t)} (CREDIT reads every sample time exactly)")
        return row

    def _scan_grid(self, levels: Sequence[float] | None) -> None:
        path = self.files["prognostic"][0][0]
        ds = self._store(path)
        for role, names in (("prognostic", self.names["upper_air"] + self.names["surface"]),
                            ("dynamic_forcing", self._file_forcing),
                            ("diagnostic", self.names["diagnostic"])):
            if names:
                held = self._store(self.files[role][0][0])
                missing = [v for v in names if v not in held.data_vars]
                if missing:
                    raise DataError(f"{self.files[role][0][0]} has no {role} variable {missing[0]!r}; it holds "
                                    f"{sorted(held.data_vars)}")
        self.lat_name = next((n for n in LAT_NAMES if n in ds.coords or n in ds.dims), None)
        self.lon_name = next((n for n in LON_NAMES if n in ds.coords or n in ds.dims), None)
        if self.lat_name is None or self.lon_name is None:
            raise DataError(f"{path} has no latitude/longitude coordinate")
        self._lat = np.asarray(ds[self.lat_name].values)
        self._lon = np.asarray(ds[self.lon_name].values)
        self.level_values: np.ndarray | None = None
        self._level_rows: np.ndarray | None = None
        if self.names["upper_air"]:
            if self.level_coord not in ds.coords and self.level_coord not in ds.dims:
                raise DataError(f"{path} has no level coordinate {self.level_coord!r} (level_coord)")
            file_levels = np.asarray(ds[self.level_coord].values, dtype=np.float64)
            wanted = file_levels if levels is None or len(levels) == 0 else np.asarray(levels, dtype=np.float64)
            rows = np.abs(file_levels[None, :] - wanted[:, None]).argmin(axis=1)
            snapped = [(float(w), float(file_levels[r])) for w, r in zip(wanted, rows) if file_levels[r] != w]
            if snapped:  # CREDIT's sel(method="nearest") takes them silently
                warn_once(f"levels {[w for w, _ in snapped]} are not in {path.name}; CREDIT reads the nearest "
                           f"({[f for _, f in snapped]}), and so does this run")
            self._level_rows = rows
            self.level_values = file_levels[rows]

    # ------------------------------------------------------------------ samples
    def __len__(self) -> int:
        return len(self._inits)

    @property
    def input_frames(self) -> int:
        return self.history_len

    def sample_times(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(input times, target times) of a sample, int64 ns."""
        t0 = int(self._inits[index])
        inputs = t0 + self.step_ns * np.arange(-(self.history_len - 1), 1, dtype=np.int64)
        targets = t0 + self.step_ns * np.arange(1, self.forecast_len + 1, dtype=np.int64)
        return inputs, targets

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"sample index {index} out of range for {len(self)} samples")
        index = int(index) % len(self)
        inputs, targets = self.sample_times(index)
        state = np.stack([self._state(t, with_diagnostic=False) for t in inputs])
        target = np.stack([self._state(t, with_diagnostic=True) for t in targets])
        block = np.stack([self._forcing(t) for t in np.append(inputs, targets)])
        if self.clamp is not None:
            for array in (state, target, block):
                np.clip(array, *self.clamp, out=array)
        return {"state": torch.from_numpy(state), "forcing": torch.from_numpy(block),
                "static": torch.zeros((0, *self.grid_shape)), "target": torch.from_numpy(target),
                "time": torch.from_numpy(np.append(inputs, targets)),
                "index": torch.tensor(index, dtype=torch.int64), "skipped": torch.tensor(0)}

    def _state(self, t: int, with_diagnostic: bool) -> np.ndarray:
        """The state channels at `t`: an input frame, or with `with_diagnostic` a target (its
        diagnostic channels added, every channel on the target side's statistics)."""
        target = with_diagnostic
        parts = [self._field("prognostic", v, t, target) for v in self.names["upper_air"]]
        parts += [self._field("prognostic", v, t, target)[None] for v in self.names["surface"]]
        if with_diagnostic:
            parts += [self._field("diagnostic", v, t, target)[None] for v in self.names["diagnostic"]]
        return np.concatenate(parts, axis=0)

    def _forcing(self, t: int) -> np.ndarray:
        parts = [self._static()] if self.names["static"] else []
        parts += [self._field("dynamic_forcing", v, t)[None] for v in self._file_forcing]
        if self.solar is not None:  # CREDIT's concat: the second source's channels after the first's
            name = self.solar.variable
            values = self._transformed(name, self.solar(t), f"data.source.{self.solar.name}", t)
            parts.append(self._normalized(name, values)[None])
        if not parts:
            return np.zeros((0, *self.grid_shape), dtype=np.float32)
        return np.concatenate(parts, axis=0)

    def _static(self) -> np.ndarray:
        if self._static_values is None:
            ds = self._store(self._static_path)
            values = []
            for var in self.names["static"]:
                if var not in ds.data_vars:
                    raise DataError(f"{self._static_path} has no static variable {var!r}; it holds "
                                    f"{sorted(ds.data_vars)}")
                da = ds[var].isel(time=0) if "time" in ds[var].dims else ds[var]
                raw = self._transformed(var, np.asarray(da.values), self._static_path, None)
                raw = self.check_finite(raw[None], var, self._static_path, None, None)[0]  # fill_values may fill NaN
                values.append(self._normalized(var, raw).reshape(self.grid_shape))
            self._static_values = np.stack(values)
        return self._static_values

    def _computed_geopotential(self, section: Mapping, scaler_file: str | None) -> ComputedGeopotential:
        """CREDIT's geopotential postblock on the de-normalised target channels, with the static
        surface geopotential as stored (CREDIT reads it from the raw inputs, before any preblock);
        its variance that of its target scaler in the loss's bridgescaler file, where it has one."""
        name = section["surface_geopotential"]
        ds = self._store(self._static_path)
        if name not in ds.data_vars:
            raise DataError(f"{self._static_path} has no static variable {name!r} (data.credit.geopotential."
                            f"surface_geopotential); it holds {sorted(ds.data_vars)}")
        da = ds[name].isel(time=0) if "time" in ds[name].dims else ds[name]
        raw = self.check_finite(np.asarray(da.values, dtype=np.float32)[None], name, self._static_path, None, None)[0]
        names = self.variable_of_channel
        computed = ComputedGeopotential(section, [names[c] for c in self.target_channel_names],
                                        raw.reshape(self.grid_shape))
        if scaler_file and section.get("output_key"):
            computed.variance = self._scaler_variance(scaler_file, str(section["output_key"]))
        return computed

    # ------------------------------------------------------------------ layout
    @property
    def times(self) -> np.ndarray:
        """First input time of every sample, datetime64[ns]."""
        return (self._inits - (self.history_len - 1) * self.step_ns).astype("datetime64[ns]")

    @property
    def forcing_channel_names(self) -> list[str]:
        return self.names["static"] + self.names["dynamic_forcing"]
