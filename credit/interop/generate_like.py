"""`credit data generate --like CREDIT.yml --out DIR [--grid HxW]`: synthetic data in exactly the
layout a CREDIT gen2 config file names (a gen1 file: `generate_like_gen1`), and a copy of the file that points at it, so a CREDIT
user smoke-tests any config in a minute.

Written into DIR, each under the name and in a folder of the name the file gives it (CREDIT's
stores sit in folders such as `all_in_one/`, `static/`, `mean_std/`, whose globs must not meet):
- one store per data path template and year (the template's strftime codes filled in, its `*`
  left out; a zarr store unless the template names `.nc`), holding the variables of every field
  type that names the template, on the file's levels (its `level_coord`) and grid (the model's
  `image_height` x `image_width`, or `--grid`);
- the static store, with the static variables;
- the normaliser's statistics: the `era5_normalizer`'s mean and std files (a level axis long
  enough for its `levels` positions), or the bridgescaler files of the `bridgescaler_transform`
  pre- and postblocks and of `loss.args.scaler_path` (input and target z-score scalers), each the
  mean and std of the generated training times (per grid point for the blocks' `spatial_variables`;
  of the values the log and sqrt preblocks make, for the variables they name, whose generated
  values are non-negative);
- DIR/<the file's name>: the file with the paths above (the inference postblocks' scaler too), `save_loc` and `inference.save_forecast`
  under DIR, a fresh start (`trainer.load_weights` off: the new `save_loc` holds no checkpoint
  to continue), the training and validation periods cut to their first `days` days, or to one
  global batch of the file's `train_batch_size` or a forecast of the default `rollout.lead_steps`
  if that is longer (CREDIT's master clock reads every time of a period), the forecasts starting at the validation period's start,
  and with `--grid` the model's grid and its boundary padding (so every stage's windows tile).

Values: per variable a travelling wave of its own amplitude and offset (from the variable's name,
so the same name gives the same field in every file) over seeded noise; no physics.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import xarray as xr
import yaml

from credit.data.generate import GenerateError, prepare_output_dir, write_atomically
from credit.interop.bridgescaler_file import FIELD_KEYS, SIDE_ROLES, var_key, write_standard_scalers
from credit.interop import generate_like_geopotential, generate_like_tisr
from credit.interop.config_gen2 import FIELD_TYPES, is_gen2, only_source, solar_source, span
from credit.interop.config_gen2_blocks import (POINTWISE, pointwise, preblock_sections, selects_nothing, source_var_keys,
                                              spatial_selection)
from credit.interop.generate_like_gen1 import generate_like_gen1
from credit.interop.like_fields import model_grid, placed, training_stats, wave_field
from credit.interop.paths import expand
from credit.interop.pointwise_blocks import Pointwise, blocks

_ROLE = {(field_type, f"vars_{dims.upper()}"): role for role, (field_type, dims) in FIELD_KEYS.items()}
"""A CREDIT source's (field type, vars_3D|vars_2D) group -> this project's variable role."""


def _store_name(template: str, when: pd.Timestamp) -> str:
    base = Path(expand(template)).name
    name = when.strftime(base).replace("*", "")
    return name if name.endswith((".nc", ".zarr")) else name + ("" if ".nc" in base else ".zarr")


def _store_path(out: Path, template: str, when: pd.Timestamp) -> Path:
    return placed(out, template).parent / _store_name(template, when)


def _refusal(conf: Mapping[str, Any]) -> str | None:
    """The first line `credit check --credit-config` would stop the file at, its data paths
    aside (they name files this command writes), or None."""
    from credit.interop.command_line import channel_mismatch
    from credit.interop.config_file import map_credit_file

    mapping = map_credit_file(conf)
    refused = [line for line in mapping.refused if "matches no file" not in line]
    if refused:
        return refused[0]
    return channel_mismatch(dict(conf.get("model") or {}), mapping.overrides)


def generate_like(config_file: str | Path, out: str | Path, *, grid: tuple[int, int] | None = None,
                  days: int = 2, seed: int = 0, overwrite: bool = False) -> Path:
    """Write data in `config_file`'s layout and the file's copy into `out`; return the copy's path."""
    source_file = Path(config_file)
    try:
        conf = yaml.safe_load(source_file.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise GenerateError(f"--like {source_file}: not a readable YAML file: {str(err).splitlines()[0]}") from None
    if not isinstance(conf, Mapping) or not isinstance(conf.get("data"), Mapping):
        raise GenerateError(f"--like {source_file}: not a CREDIT config file (it has no `data` section)")
    refusal = _refusal(conf)
    if refusal:  # data for a file that would not train here: not one byte of it
        raise GenerateError(f"--like {source_file}: {refusal} (credit check --credit-config {source_file} says more)")
    if not is_gen2(conf):
        return generate_like_gen1(conf, source_file, out, grid=grid, days=days, seed=seed, overwrite=overwrite)
    found = only_source(conf["data"], "data")
    if isinstance(found, str):
        raise GenerateError(f"--like {source_file}: {found}")
    name, src = found
    model = dict(conf.get("model") or {})
    grid, resized = model_grid(model, grid, source_file)
    levels = [float(v) for v in src.get("levels") or range(1, int(model.get("levels", 4)) + 1)]
    level_coord = str(src.get("level_coord") or "level")
    step = span(conf["data"].get("timestep", "6h"))
    out = Path(out).expanduser().resolve()
    prepare_output_dir(out, overwrite, written=("*",))
    rng = np.random.default_rng(seed)
    lat = np.linspace(90, -90, grid[0])
    lon = np.linspace(0, 360, grid[1], endpoint=False)

    trainer = dict(conf.get("trainer") or {})
    window = int(conf["data"].get("history_len", 1)) + int(conf["data"].get("forecast_len", 1))
    # at least one global batch of the file's batch size on one rank, and a forecast of this
    # project's default length (`rollout.lead_steps`) when the file has no `inference` section
    from credit.config.schema import RolloutConfig

    count = max(int(pd.Timedelta(days=days) / step), int(trainer.get("train_batch_size", 1)) + window,
                RolloutConfig.lead_steps + int(conf["data"].get("history_len", 1)))

    def period(section: Mapping[str, Any]) -> pd.DatetimeIndex:
        start = pd.Timestamp(str(section.get("start_datetime", conf["data"]["start_datetime"])))
        return pd.date_range(start, periods=count, freq=step)

    valid_section = dict(conf.get("validation_data") or conf["data"])
    periods = {"data": period(conf["data"]), "validation_data": period(valid_section)}
    templates: dict[str, list[tuple[str, str]]] = {}  # template -> [(field type, vars key)]
    names: dict[str, list[str]] = {role: [] for role in _ROLE.values()}
    variables = dict(src.get("variables") or {})
    for field_type in FIELD_TYPES:
        group = variables.get(field_type) if isinstance(variables.get(field_type), Mapping) else {}
        for dims in ("vars_3D", "vars_2D"):
            if group.get(dims):
                if (field_type, dims) not in _ROLE:
                    raise GenerateError(f"--like {source_file}: 3-D {field_type} variables are not read here")
                names[_ROLE[field_type, dims]] += list(group[dims])
                templates.setdefault(str(group["path"]), []).append((field_type, dims))

    every_time = periods["data"].union(periods["validation_data"])  # one year's file holds both, if they share it
    in_training = every_time.isin(periods["data"])
    training: dict[str, np.ndarray] = {}  # variable -> its training values as the scaler sees them
    transforms = _preblock_transforms(conf)
    solar = solar_source(conf["data"])
    if solar is not None:  # computed, not written: its table beside the copy, its values for the statistics
        table, what = generate_like_tisr.place_table(source_file, out)
        print(f"tisr (data.source.{solar[0]}): the total solar irradiance table is {what}")
        names["dynamic_forcing"].append("tisr")
        values = generate_like_tisr.training_values(solar[1], grid, every_time[in_training], step, table)
        training["tisr"] = _seen(values, "tisr", transforms)
    stores: dict[str, tuple[str, list[tuple[str, str]]]] = {}  # templates naming one file write it together
    for template, groups in templates.items():
        _, merged = stores.setdefault(str(_store_path(out, template, every_time[0])), (template, []))
        merged += groups
    for template, groups in stores.values():
        static = any(field_type == "static" for field_type, _ in groups)
        data_vars = {}
        for field_type, dims in groups:
            for var in variables[field_type][dims]:
                upper = dims == "vars_3D"
                values = wave_field(var, (len(every_time), *((len(levels),) if upper else ()), *grid), every_time.values,
                                rng)
                if any(var in names for _, names in transforms):  # in a log's or sqrt's domain
                    values = np.abs(values)
                training[var] = _seen(values[in_training], var, transforms)
                if static:
                    data_vars[var] = (("latitude", "longitude"), values[0])
                else:
                    data_vars[var] = (("time", level_coord, "latitude", "longitude") if upper
                                      else ("time", "latitude", "longitude"), values)
        coords: dict[str, Any] = {"latitude": lat, "longitude": lon}
        if not static:
            coords["time"] = every_time.values
            if any(dims == "vars_3D" for _, dims in groups):
                coords[level_coord] = levels
        ds = xr.Dataset(data_vars, coords=coords)
        if static:
            write_atomically(ds, _store_path(out, template, every_time[0]))
            continue
        for year in sorted(set(every_time.year)):
            rows = np.flatnonzero(every_time.year == year)
            write_atomically(ds.isel(time=rows), _store_path(out, template, every_time[rows[0]]))

    copy_conf = _copy_config(conf, out, templates, periods, step, training, names, name, levels, resized)
    if solar is not None:
        _solar_copy(copy_conf, solar[0], out, grid, lat, lon, resized is not None)
    for line in generate_like_geopotential.place_level_info(copy_conf, source_file, out, levels):
        print(f"geopotential_diagnostic: the level coefficient file {line}")
    path = out / source_file.name
    path.write_text(yaml.safe_dump(copy_conf, sort_keys=False))
    return path


def _seen(values: np.ndarray, var: str, transforms: Sequence[tuple[Pointwise, list[str]]]) -> np.ndarray:
    """A variable's training values as the scaler sees them: through the log and sqrt
    preblocks that name it."""
    chain = [block for block, names in transforms if var in names]
    if not chain:
        return values
    seen = torch.from_numpy(values.astype(np.float32))
    for block in chain:
        seen = block(seen)
    return seen.double().numpy()


def _solar_copy(conf: dict, name: str, out: Path, grid: tuple[int, int], lat: np.ndarray, lon: np.ndarray,
                resized: bool) -> None:
    """The copy's tisr source on the data's grid: a grid file written beside the data, or with
    `--grid` the specs on the new grid (both sections: validation_data's may be its own)."""
    for section in ("data", "validation_data"):
        src = dict(dict(conf.get(section) or {}).get("source") or {}).get(name)
        if not isinstance(src, dict):
            continue
        if src.get("latlon_grid_path"):
            src["latlon_grid_path"] = str(generate_like_tisr.grid_file(out, lat, lon))
        elif resized and src.get("lat_spec") is not None:
            src.update(generate_like_tisr.resized_specs(src, grid))


def _copy_config(conf: Mapping[str, Any], out: Path, templates: Mapping[str, Any], periods: Mapping[str, Any],
                 step: pd.Timedelta, training: Mapping[str, np.ndarray], names: Mapping[str, Sequence[str]],
                 source: str, levels: Sequence[float], resized: Mapping[str, Any] | None) -> dict:
    conf = copy.deepcopy(dict(conf))
    fmt = "%Y-%m-%dT%H:%M:%S"
    for section in ("data", "validation_data"):
        if not isinstance(conf.get(section), dict):
            continue
        times = periods[section]
        conf[section]["start_datetime"], conf[section]["end_datetime"] = times[0].strftime(fmt), times[-1].strftime(fmt)
        for src in dict(conf[section].get("source") or {}).values():
            for group in dict(src.get("variables") or {}).values():
                if isinstance(group, dict) and group.get("path"):
                    group["path"] = str(placed(out, group["path"]))
    static_store = next((_store_path(out, t, periods["data"][0]) for t, groups in templates.items()
                         if any(g[0] == "static" for g in groups)), None)
    scaler_files: set[str] = set()
    keys = source_var_keys(conf)
    spatial: set[str] = set()
    for phase in [*preblock_sections(conf).values(), *dict(conf.get("postblocks") or {}).values()]:
        for block in dict(phase or {}).values():
            if dict(block or {}).get("type") == "bridgescaler_transform":
                spatial.update(spatial_selection(dict(block.get("args") or {}), keys))
    for phase in preblock_sections(conf).values():
        for block in dict(phase or {}).values():
            args = dict(block or {}).get("args") or {}
            if block.get("type") == "era5_normalizer":
                for key in ("mean_path", "std_path"):
                    args[key] = str(placed(out, args[key]))
                _write_normaliser(args, training, names, levels)
            if block.get("type") == "bridgescaler_transform" and args.get("scaler_path"):
                args["scaler_path"] = str(placed(out, args["scaler_path"]))
                scaler_files.add(args["scaler_path"])
    inference_blocks = dict(conf.get("inference") or {}).get("postblocks") if isinstance(conf.get("inference"), dict) \
        else None
    for phase in [*dict(conf.get("postblocks") or {}).values(), *dict(inference_blocks or {}).values()]:
        for block in dict(phase or {}).values():
            args = dict(block or {}).get("args") or {}
            if args.get("scaler_path"):
                args["scaler_path"] = str(placed(out, args["scaler_path"]))
                scaler_files.add(args["scaler_path"])
    loss = conf.get("loss") if isinstance(conf.get("loss"), dict) else {}
    loss_args = loss.get("args") if isinstance(loss.get("args"), dict) else {}
    if loss_args.get("scaler_path"):
        loss_args["scaler_path"] = str(placed(out, loss_args["scaler_path"]))
        scaler_files.add(loss_args["scaler_path"])
    for holder in (loss, loss_args):
        if holder.get("latitude_weights") and static_store is not None:
            holder["latitude_weights"] = str(static_store)
    for file in scaler_files:
        solar = solar_source(conf.get("data") or {})
        write_standard_scalers(file, {side: {var_key(solar[0] if solar and role == "dynamic_forcing" and v == "tisr"
                                                     else source, role, v): training_stats(training[v], v in spatial)
                                             for role in roles for v in names[role]}
                                      for side, roles in SIDE_ROLES.items()})
    conf["save_loc"] = str(out / "run")
    trainer = conf.get("trainer")
    if isinstance(trainer, dict) and trainer.get("load_weights"):  # no save_loc/checkpoint.pt to continue from
        trainer["load_weights"], trainer["load_optimizer"] = False, False
    inference = conf.get("inference")
    if isinstance(inference, dict):
        first = periods["validation_data"][0]
        inference["save_forecast"] = str(out / "forecasts")
        length = f"{int((len(periods['validation_data']) // 2) * step / pd.Timedelta(hours=1))}h"
        if isinstance(inference.get("batch_forecast"), dict):
            inference["batch_forecast"].update(first_init_date=first.strftime(fmt), last_init_date=first.strftime(fmt),
                                               forecast_length=length)
        if isinstance(inference.get("single_forecast"), dict):
            inference["single_forecast"].update(start_datetime=first.strftime(fmt), forecast_length=length)
    if resized is not None:
        conf["model"] = dict(resized)
    return conf


def _preblock_transforms(conf: Mapping[str, Any]) -> list[tuple[Pointwise, list[str]]]:
    """The file's log and sqrt preblocks, each with the bare names it transforms."""
    keys = source_var_keys(conf)
    entries = []
    for name, block in dict(preblock_sections(conf).get("per_step") or {}).items():
        kind, args = dict(block or {}).get("type"), dict(dict(block or {}).get("args") or {})
        if POINTWISE.get(kind) == "preblocks" and not selects_nothing(name, kind, args, keys):
            entry = pointwise(name, kind, args, keys)
            if isinstance(entry, dict):
                entries.append(entry)
    return blocks(entries)


def _write_normaliser(args: Mapping[str, Any], training: Mapping[str, np.ndarray], names: Mapping[str, Sequence[str]],
                      levels: Sequence[float]) -> None:
    """The era5_normalizer's mean and std files: every variable's statistics over the generated
    training times; upper-air variables on a `level` axis whose 1-indexed `levels` positions (or
    its whole length, then with the data's level values) hold the data's levels in order."""
    positions = [int(p) for p in args.get("levels") or range(1, len(levels) + 1)]
    axis = max(positions)
    means, stds = {}, {}
    for role, role_names in names.items():
        for var in role_names:
            mean, std = training_stats(training[var])
            if role == "upper_air":
                full_mean, full_std = np.zeros(axis), np.ones(axis)
                full_mean[[p - 1 for p in positions]], full_std[[p - 1 for p in positions]] = mean, std
                means[var], stds[var] = ("level", full_mean), ("level", full_std)
            else:
                means[var], stds[var] = ((), float(mean)), ((), float(std))
    # the data's levels where the positions are the whole axis, so the run finds the levels it
    # reads (a longer axis picked by position keeps its position numbers: CREDIT's own layout)
    whole = positions == list(range(1, len(levels) + 1))
    coords = {"level": np.asarray(levels, dtype=np.float64) if whole else np.arange(1, axis + 1)}
    for key, table in (("mean_path", means), ("std_path", stds)):
        write_atomically(xr.Dataset(table, coords=coords), Path(args[key]))
