"""`credit data generate --like CREDIT.yml` for a CREDIT **gen1** file: synthetic data in
exactly the layout its `data:` section names, and a copy of the file that points at it.

Written into DIR, each in a folder of the name the file gives it (`placed`):
- per yearly glob (`save_loc`, `save_loc_surface`, `save_loc_dynamic_forcing`,
  `save_loc_diagnostic`) one file per year, named by the glob with the year in its wildcard
  (`ERA5_6h*` -> `ERA5_6h_2000.zarr`, `y_????_F32.zarr` -> `y_2000_F32.zarr`, `y*12-31.zarr` ->
  `y_2000_12-31.zarr`, `*.nc` -> `2000.nc`; a zarr store unless the name ends `.nc`-something),
  holding the variables of every group that names the glob: upper-air on (time, level,
  latitude, longitude), the others on (time, latitude, longitude). The year is the first of
  `train_years` and the first of `valid_years` (CREDIT's end years are exclusive); the time
  step is `lead_time_periods` hours. Every name is planned first (`_planned`): a glob that
  would also read another key's file, or one file named for two things, is refused before
  anything is written;
- the levels: `level_ids` where it holds `model.levels` values (CREDIT's model-level ids),
  else 1..`model.levels`;
- `save_loc_static` with the static variables; `save_loc_physics`, when the model's
  conservation post blocks are on, with what they read (`lon_lat_level_name`: 2-D longitude
  and latitude and pressures in Pa, or pure-sigma `a`, `b` coefficients; the energy fixer's
  surface geopotential); `loss.latitude_weights` with CREDIT's `coslat`; files the config
  names twice are one file;
- `save_loc_forcing` with `forcing_variables` at the (month, day, hour) of every written time
  in the leap year 2000 (CREDIT matches forcing times that way);
- `mean_path` / `std_path`: float64 mean and std of the generated training times, upper-air
  per level on `level`, the rest scalars;
- DIR/<the file's name>: the file with those paths, `save_loc` and `predict.save_forecast`
  under DIR, the years cut to one each, a fresh start (`trainer.load_weights` off: the new
  `save_loc` holds no checkpoint to continue), one forecast of a day (or of one step, when a
  step is longer) from the validation year's first time, and with `--grid` the model's grid (and boundary padding).
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr
import yaml

from credit.data.generate import GenerateError, prepare_output_dir, write_atomically
from credit.interop.data_gen1 import file_year
from credit.interop.like_fields import model_grid, placed, training_stats, wave_field
from credit.interop.paths import expand

YEARLY = (("variables", "save_loc", "upper_air"), ("surface_variables", "save_loc_surface", "surface"),
          ("dynamic_forcing_variables", "save_loc_dynamic_forcing", "dynamic_forcing"),
          ("diagnostic_variables", "save_loc_diagnostic", "diagnostic"))
"""CREDIT's gen1 yearly groups: (variables key, glob key, role)."""
_NORMALISED = ("upper_air", "surface", "dynamic_forcing", "diagnostic")  # in mean_path / std_path
_FORCING_YEAR = 2000  # a leap year: every (month, day, hour) has a time in it
_CONSERVATION = ("global_mass_fixer", "global_water_fixer", "global_energy_fixer")


def _yearly_name(source: Path, key: str, pattern: str, year: int) -> str:
    """The name of `pattern`'s file of `year`: the year in its first `????` or `*` (set apart by
    `_` from a letter or digit beside it), other wildcards filled; a zarr store (`.zarr`
    added where the glob still matches) unless the name ends `.nc`-something."""
    base = Path(expand(pattern)).name
    if "[" in base:
        raise GenerateError(f"--like {source}: data.{key}: {pattern!r}: character classes are not written here; "
                            "use * or ???? for the year")
    if "????" in base:
        name = base.replace("????", f"{year:04d}", 1)
    elif "*" in base:
        at = base.index("*")
        before = "_" if at and base[at - 1].isalnum() else ""
        after = "_" if at + 1 < len(base) and base[at + 1].isalnum() else ""
        name = base[:at] + before + f"{year:04d}" + after + base[at + 1:]
    else:
        raise GenerateError(f"--like {source}: data.{key}: {pattern!r} has no wildcard for the year; CREDIT's gen1 "
                            "data is one file per year, found by a glob")
    name = name.replace("*", "").replace("?", "0")
    if file_year(Path(name)) != year:
        raise GenerateError(f"--like {source}: data.{key}: {pattern!r}: a file {name} would not be read as year "
                            f"{year} (its last four-digit group is the year)")
    if not name.endswith(".zarr") and not Path(name).suffix.startswith(".nc") \
            and fnmatch.fnmatchcase(name + ".zarr", base):
        name += ".zarr"
    return name


def _first_year(source: Path, data: Mapping[str, Any], key: str) -> int:
    try:
        first, last = (int(v) for v in data[key])
    except (KeyError, TypeError, ValueError):
        raise GenerateError(f"--like {source}: data.{key}: {data.get(key)!r}; CREDIT's gen1 data reads "
                            "[first year, end year] as two integers") from None
    if last <= first:
        raise GenerateError(f"--like {source}: data.{key}: {[first, last]} holds no year (the end year is exclusive)")
    return first


def _levels(data: Mapping[str, Any], model: Mapping[str, Any]) -> list[float]:
    count = int(model.get("levels") or data.get("levels") or len(data.get("level_ids") or []) or 4)
    ids = [float(v) for v in data.get("level_ids") or []]
    return ids if len(ids) == count else [float(v) for v in range(1, count + 1)]


def _counts(conf: Mapping[str, Any], data: Mapping[str, Any], step: pd.Timedelta, days: int) -> int:
    """Times per year: `days` days, and at least one batch of the file's batch size, the
    longest training or validation window, and the copy's one-day forecast."""
    trainer = dict(conf.get("trainer") or {})
    window = max(int(data.get("history_len", 1)) + int(data.get("forecast_len") or 0) + 1,
                 int(data.get("valid_history_len") or data.get("history_len", 1))
                 + int(data.get("valid_forecast_len") or 0) + 1)
    forecast = int(pd.Timedelta(days=_forecast_days(step)) / step) + int(data.get("history_len", 1)) + 1
    return max(int(pd.Timedelta(days=days) / step), int(trainer.get("train_batch_size", 1)) + window, forecast)


def _side_files(conf: Mapping[str, Any], data: Mapping[str, Any], model: Mapping[str, Any], levels: Sequence[float],
                grid: tuple[int, int], out: Path, static: Sequence[str], rng: np.random.Generator
                ) -> dict[Path, dict[str, Any]]:
    """Static, physics and latitude-weight files: path -> variables (one file where the config
    names one path for several)."""
    files: dict[Path, dict[str, Any]] = {}
    lat = np.linspace(90, -90, grid[0])
    lon = np.linspace(0, 360, grid[1], endpoint=False)
    one_time = np.array(["2000-01-01"], dtype="datetime64[ns]")
    if static:
        files.setdefault(placed(out, data["save_loc_static"]), {}).update(
            {v: (("latitude", "longitude"), wave_field(v, (1, *grid), one_time, rng)[0]) for v in static})
    post = dict(model.get("post_conf") or {})
    fixers = [name for name in _CONSERVATION if post.get("activate") and (post.get(name) or {}).get("activate")]
    if fixers and data.get("save_loc_physics"):
        mass = dict(post.get("global_mass_fixer") or {})
        names = list(mass.get("lon_lat_level_name") or [])
        physics = files.setdefault(placed(out, data["save_loc_physics"]), {})
        lon2d, lat2d = np.meshgrid(lon, lat)
        if len(names) >= 2:
            physics.update({names[0]: (("latitude", "longitude"), lon2d), names[1]: (("latitude", "longitude"), lat2d)})
        if mass.get("grid_type") == "sigma" and len(names) >= 4:  # pure sigma: p = b x surface pressure
            count = len(levels) + (1 if mass.get("midpoint") else 0)
            physics.update({names[2]: (("ilev",), np.zeros(count)), names[3]: (("ilev",), np.linspace(0, 1, count))})
        elif len(names) >= 3:
            physics[names[2]] = (("plev",), np.linspace(100e2, 1000e2, len(levels)))
        for name in (post.get("global_energy_fixer") or {}).get("surface_geopotential_name") or []:
            physics[name] = (("latitude", "longitude"), wave_field(name, (1, *grid), one_time, rng)[0])
    latitude_weights = (conf.get("loss") or {}).get("latitude_weights")
    if isinstance(latitude_weights, str) and latitude_weights:
        coslat = np.cos(np.deg2rad(lat))[:, None] * np.ones(grid[1])
        files.setdefault(placed(out, latitude_weights), {})["coslat"] = (("latitude", "longitude"), coslat)
    return files


def _planned(source: Path, data: Mapping[str, Any], out: Path, patterns: Mapping[str, Sequence[tuple[str, str]]],
             years: Sequence[int]) -> tuple[dict[str, list[Path]], Path | None]:
    """Every yearly file by glob, and the forcing file, before anything is written: one error
    where a glob would also read a file written for another key, or one file stands for two."""
    yearly = {pattern: [placed(out, pattern, make=False).parent / _yearly_name(source, groups[0][0], pattern, y)
                        for y in years] for pattern, groups in patterns.items()}
    forcing = None
    if data.get("forcing_variables"):
        forcing = placed(out, data["save_loc_forcing"], make=False)
        if any(c in forcing.name for c in "*?["):  # CREDIT globs it; one file must match
            forcing = forcing.parent / _yearly_name(source, "save_loc_forcing", data["save_loc_forcing"], _FORCING_YEAR)
    stats = {key: placed(out, data[key], make=False) for key in ("mean_path", "std_path")}
    others = {key: placed(out, data[key], make=False) for key in ("save_loc_static", "save_loc_physics")
              if data.get(key)}
    every = [p for paths in yearly.values() for p in paths] + ([forcing] if forcing else []) \
        + list(stats.values()) + list(others.values())
    for pattern, paths in yearly.items():
        glob_path = placed(out, pattern, make=False)
        read = {p for p in every if p.parent == glob_path.parent and fnmatch.fnmatchcase(p.name, glob_path.name)}
        if read != set(paths):
            raise GenerateError(f"--like {source}: data.{patterns[pattern][0][0]}: {pattern!r} would also read "
                                f"{sorted(p.name for p in read - set(paths))}, written for another key")
    for pattern, paths in yearly.items():  # CREDIT picks a year's files by the year anywhere in the path
        for year, path in zip(years, paths):
            picked = [p for p in paths if str(year) in str(p)]
            if picked != [path]:
                raise GenerateError(f"--like {source}: CREDIT's year filter (the year anywhere in the path) would "
                                    f"read {[str(p) for p in picked]} as {year}; choose an --out without year strings")
    if stats["mean_path"] == stats["std_path"]:
        raise GenerateError(f"--like {source}: data.mean_path and data.std_path name one file; CREDIT reads the mean "
                            "and the std of each variable from two")
    for key, path in stats.items():
        clash = [k for k, p in {**others, "save_loc_forcing": forcing}.items() if p == path]
        if clash:
            raise GenerateError(f"--like {source}: data.{key} and data.{clash[0]} name one file, {path.name}")
    return yearly, forcing


def generate_like_gen1(conf: Mapping[str, Any], source: Path, out: str | Path, *, grid: tuple[int, int] | None = None,
                       days: int = 2, seed: int = 0, overwrite: bool = False) -> Path:
    """Write data in the gen1 file `conf`'s (read from `source`) layout and the file's copy
    into `out`; return the copy's path. Every refusal comes before anything is written."""
    data = dict(conf["data"])
    model = dict(conf.get("model") or {})
    grid, resized = model_grid(model, grid, source)
    names = {role: list(data.get(key) or []) for key, _, role in YEARLY}
    if not names["upper_air"] and not names["surface"]:
        raise GenerateError(f"--like {source}: data.variables and data.surface_variables are both empty")
    for key, loc, role in YEARLY:
        if names[role] and not data.get(loc):
            raise GenerateError(f"--like {source}: data.{key} are named and data.{loc} (their files) is not")
    for key in ("mean_path", "std_path"):
        if not data.get(key):
            raise GenerateError(f"--like {source}: data.{key} is not set (CREDIT's gen1 data is z-scored with it)")
    static, forcing = list(data.get("static_variables") or []), list(data.get("forcing_variables") or [])
    for key, loc in (("static_variables", "save_loc_static"), ("forcing_variables", "save_loc_forcing")):
        if data.get(key) and not data.get(loc):
            raise GenerateError(f"--like {source}: data.{key} are named and data.{loc} (their file) is not")
    levels = _levels(data, model)
    step = pd.Timedelta(hours=int(data.get("lead_time_periods") or 1))
    train_year, valid_year = _first_year(source, data, "train_years"), _first_year(source, data, "valid_years")
    count = _counts(conf, data, step, days)
    train_times = pd.date_range(f"{train_year}-01-01", periods=count, freq=step)
    every_time = train_times.union(pd.date_range(f"{valid_year}-01-01", periods=count, freq=step))
    in_training = every_time.isin(train_times)
    patterns: dict[str, list[tuple[str, str]]] = {}  # glob -> [(glob key, role)] of the groups naming it
    for _, loc, role in YEARLY:
        if names[role]:
            patterns.setdefault(str(data[loc]), []).append((loc, role))
    out = Path(out).expanduser().resolve()
    yearly, forcing_path = _planned(source, data, out, patterns, sorted(set(every_time.year)))
    prepare_output_dir(out, overwrite, written=("*",))
    rng = np.random.default_rng(seed)
    lat = np.linspace(90, -90, grid[0])
    lon = np.linspace(0, 360, grid[1], endpoint=False)

    training: dict[str, np.ndarray] = {}
    for pattern, groups in patterns.items():
        data_vars = {}
        for _, role in groups:
            for var in names[role]:
                upper = role == "upper_air"
                values = wave_field(var, (len(every_time), *((len(levels),) if upper else ()), *grid),
                                    every_time.values, rng)
                training[var] = values[in_training]
                dims = ("time", "level", "latitude", "longitude") if upper else ("time", "latitude", "longitude")
                data_vars[var] = (dims, values)
        coords: dict[str, Any] = {"time": every_time.values, "latitude": lat, "longitude": lon}
        if any(role == "upper_air" for _, role in groups):
            coords["level"] = levels
        ds = xr.Dataset(data_vars, coords=coords)
        placed(out, pattern)  # its folder
        for year, path in zip(sorted(set(every_time.year)), yearly[pattern]):
            write_atomically(ds.isel(time=np.flatnonzero(every_time.year == year)), path)

    files = _side_files(conf, data, model, levels, grid, out, static, rng)
    coords = {"latitude": lat, "longitude": lon}
    if forcing:  # at each written time's (month, day, hour) in a leap year; beside the statics if one file
        times = pd.DatetimeIndex([t.replace(year=_FORCING_YEAR) for t in every_time]).unique().sort_values()
        placed(out, data["save_loc_forcing"])
        files.setdefault(forcing_path, {}).update(
            {v: (("time", "latitude", "longitude"), wave_field(v, (len(times), *grid), times.values, rng))
             for v in forcing})
    for path, variables in files.items():
        timed = any("time" in dims for dims, _ in variables.values())
        write_atomically(xr.Dataset(variables, coords={**coords, **({"time": times.values} if timed else {})}), path)
    _write_statistics(data, out, names, training, levels)

    copy_conf = _copy_config(conf, out, train_year, valid_year, step, resized)
    path = out / source.name
    path.write_text(yaml.safe_dump(copy_conf, sort_keys=False))
    return path


def _write_statistics(data: Mapping[str, Any], out: Path, names: Mapping[str, Sequence[str]],
                      training: Mapping[str, np.ndarray], levels: Sequence[float]) -> None:
    means, stds = {}, {}
    for role in _NORMALISED:
        for var in names[role]:
            mean, std = training_stats(training[var])
            dims = ("level",) if role == "upper_air" else ()
            means[var], stds[var] = (dims, mean if dims else float(mean)), (dims, std if dims else float(std))
    for key, table in (("mean_path", means), ("std_path", stds)):
        write_atomically(xr.Dataset(table, coords={"level": list(levels)}), placed(out, data[key]))


def _forecast_days(step: pd.Timedelta) -> int:
    """Days of the copy's one forecast: one, or enough for one step of a longer time step."""
    return max(1, -(-int(step / pd.Timedelta(hours=1)) // 24))


def _copy_config(conf: Mapping[str, Any], out: Path, train_year: int, valid_year: int, step: pd.Timedelta,
                 resized: Mapping[str, Any] | None) -> dict:
    conf = copy.deepcopy(dict(conf))
    data = conf["data"]
    for key in ("save_loc", "save_loc_surface", "save_loc_dynamic_forcing", "save_loc_diagnostic", "save_loc_forcing",
                "save_loc_static", "save_loc_physics", "mean_path", "std_path"):
        if data.get(key):
            data[key] = str(placed(out, data[key]))
    data["train_years"], data["valid_years"] = [train_year, train_year + 1], [valid_year, valid_year + 1]
    loss = conf.get("loss")
    if isinstance(loss, dict) and isinstance(loss.get("latitude_weights"), str) and loss["latitude_weights"]:
        loss["latitude_weights"] = str(placed(out, loss["latitude_weights"]))
    conf["save_loc"] = str(out / "run")
    trainer = conf.get("trainer")
    if isinstance(trainer, dict) and trainer.get("load_weights"):  # no save_loc/checkpoint.pt to continue from
        trainer["load_weights"], trainer["load_optimizer"] = False, False
    predict = conf.get("predict")
    if isinstance(predict, dict):
        predict["save_forecast"] = str(out / "forecasts")
        if predict.get("forecasts"):
            predict["forecasts"] = {"type": "custom", "start_year": valid_year, "start_month": 1, "start_day": 1,
                                    "start_hours": [0], "duration": 1, "days": _forecast_days(step)}
    if resized is not None:
        conf["model"] = dict(resized)
    return conf
