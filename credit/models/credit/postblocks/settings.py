"""CREDIT's `post_conf` read as CREDIT's config parser reads it (`credit/parser.py`): the
channel names of the output and the input, the channel indices each fixer works on, the
statistics that de-normalise them and the physics file of the conservation fixers.

Channel names: the output is each upper-air variable at every level (variable-major), then
the surface variables, then the diagnostics; an index list is every output position whose
name the fixer names, in output order. Statistics are CREDIT's `std_new` scaler: one
variable per name in the mean and std files, upper-air ones taken by position along their
level dimension, applied in float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import xarray as xr

from credit.models.credit.postblocks.physics import ColumnPhysics

FIXERS = ("tracer_fixer", "global_mass_fixer", "global_water_fixer", "global_energy_fixer")
# post_conf modules CREDIT's PostBlock runs that are not built here (any other module
# name, e.g. `global_drymass_fixer`, CREDIT's PostBlock never reads)
OTHER_MODULES = ("skebs", "global_energy_fixer_updown")


class PostBlockConfigError(ValueError):
    """A `post_conf` or `data` key that cannot be honoured; the message names it."""


@dataclass
class ChannelLayout:
    """The output's channel names, and the statistics of the state channels."""

    output_names: list[str]
    state_channels: int  # upper-air levels + surface: the channels x and y share, first
    mean: torch.Tensor = field(repr=False)  # (C_out,) float32
    std: torch.Tensor = field(repr=False)
    normalized: bool = True  # False: the model sees physical values, and `denorm` does nothing

    def indices(self, names: list[str], key: str) -> list[int]:
        found = [i for i, name in enumerate(self.output_names) if name in names]
        if not found:
            raise PostBlockConfigError(f"post_conf.{key}={names} names no output channel; the output holds "
                                       f"{sorted(set(self.output_names))}")
        return found

    def contiguous(self, names: list[str], key: str) -> slice:
        """CREDIT's fixers slice from the first index to the last: the channels must be one run."""
        found = self.indices(names, key)
        if found != list(range(found[0], found[-1] + 1)):
            raise PostBlockConfigError(f"post_conf.{key}={names} gives output channels {found}, which are not "
                                       f"contiguous as CREDIT's fixers need")
        return slice(found[0], found[-1] + 1)


def _names(data: Mapping[str, Any], key: str) -> list[str]:
    return list(data.get(key) or [])


def resolve_path(value: Any, key: str, config_dir: Path) -> Path:
    """A path of the CREDIT config: as given when absolute; a relative one is looked for
    beside the config file, then (as CREDIT opens it) in the working directory."""
    if not value:
        raise PostBlockConfigError(f"{key} is needed by the post blocks and is not set")
    path = Path(str(value)).expanduser()
    candidates = [path] if path.is_absolute() else [config_dir / path, Path.cwd() / path]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise PostBlockConfigError(f"{key}={value}: no such file (looked for {', '.join(map(str, candidates))})")


def channel_layout(data: Mapping[str, Any], levels: int, config_dir: Path) -> ChannelLayout:
    """The output channels of CREDIT's gen1 data section and their `std_new` statistics."""
    scaler = data.get("scaler_type", "std_new")
    if scaler != "std_new":
        raise PostBlockConfigError(f"data.scaler_type={scaler!r}: the post blocks de-normalise with CREDIT's "
                                   f"std_new scaler only")
    upper, surface, diagnostic = _names(data, "variables"), _names(data, "surface_variables"), \
        _names(data, "diagnostic_variables")
    output = [name for name in upper for _ in range(levels)] + surface + diagnostic
    stats = []
    for key in ("mean_path", "std_path"):
        path = resolve_path(data.get(key), f"data.{key}", config_dir)
        with xr.open_dataset(path) as ds:
            values = []
            for name in upper + surface + diagnostic:
                if name not in ds:
                    raise PostBlockConfigError(f"data.{key}={path}: has no variable {name!r}")
                array = torch.tensor(ds[name].values, dtype=torch.float64)
                values += [array[i] for i in range(levels)] if name in upper else [array.reshape(())]
        stats.append(torch.stack(values).to(torch.float32))
    return ChannelLayout(output, len(upper) * levels + len(surface), stats[0], stats[1])


def channel_layout_gen2(config: Mapping[str, Any], config_dir: Path) -> ChannelLayout:
    """The output channels of CREDIT's gen2 data section (`data.source.ERA5`) and their
    statistics, as CREDIT's gen2 rollout de-normalises: prognostic 3-D variables at every
    level, prognostic 2-D, diagnostic 3-D, diagnostic 2-D; mean and std from the
    normaliser's files (`preblocks[.per_step].norm.args`), 3-D ones selected along
    `level_coord` at `levels` (every level of the file when `levels` is unset), and a
    variable the files lack left as mean 0, std 1, as CREDIT leaves it."""
    source = (config["data"].get("source") or {}).get("ERA5")
    if not isinstance(source, Mapping):
        raise PostBlockConfigError("data.source.ERA5 is not set: the post blocks read their channels from it")
    variables = source.get("variables") or {}
    group = {kind: variables.get(kind) or {} for kind in ("prognostic", "diagnostic")}
    levels = source.get("levels")
    count = len(levels) if levels else int((config.get("model") or {}).get("levels") or 0)
    preblocks = config.get("preblocks") or {}
    norm = (preblocks.get("norm") or (preblocks.get("per_step") or {}).get("norm") or {}).get("args") or {}
    level_coord = source.get("level_coord", "level")
    columns = [(name, kind == "3D") for part in ("prognostic", "diagnostic") for kind in ("3D", "2D")
               for name in group[part].get(f"vars_{kind}") or []]
    output = [name for name, upper in columns for _ in range(count if upper else 1)]
    stats = []
    for key in ("mean_path", "std_path"):
        path = resolve_path(norm.get(key), f"preblocks.norm.args.{key}", config_dir)
        with xr.open_dataset(path) as ds:
            values = []
            for name, upper in columns:
                if name not in ds:
                    values.append(torch.full((count if upper else 1,), 0.0 if key == "mean_path" else 1.0,
                                             dtype=torch.float64))
                    continue
                array = ds[name].sel({level_coord: levels}) if upper and levels else ds[name]
                values.append(torch.tensor(array.values, dtype=torch.float64).reshape(-1))
        stats.append(torch.cat(values).to(torch.float32))
    if stats[0].numel() != len(output):
        raise PostBlockConfigError(f"preblocks.norm.args: the statistics give {stats[0].numel()} channels for the "
                                   f"{len(output)} of data.source.ERA5 ({count} levels)")
    state = len(group["prognostic"].get("vars_3D") or []) * count + len(group["prognostic"].get("vars_2D") or [])
    return ChannelLayout(output, state, stats[0], stats[1])


def column_physics(post_conf: Mapping[str, Any], path: Path, key: str, deterministic: bool = False) -> ColumnPhysics:
    """The grid and levels of the physics file `path` (the config's `key`), as the mass
    fixer's section names them (CREDIT's water and energy fixers read the mass fixer's
    `lon_lat_level_name`, `grid_type` and `midpoint` too)."""
    mass = post_conf.get("global_mass_fixer") or {}
    for name in ("lon_lat_level_name", "grid_type"):
        if name not in mass and not (name == "grid_type" and mass.get("activate")):
            raise PostBlockConfigError(f"post_conf.global_mass_fixer.{name} is needed by CREDIT's conservation "
                                       f"fixers (they read it from the mass fixer's section) and is not set")
    names = list(mass["lon_lat_level_name"])
    grid_type = mass.get("grid_type", "pressure")
    if grid_type not in ("pressure", "sigma"):
        raise PostBlockConfigError(f"post_conf.global_mass_fixer.grid_type={grid_type!r}: pressure or sigma")
    if len(names) < (4 if grid_type == "sigma" else 3):
        raise PostBlockConfigError(f"post_conf.global_mass_fixer.lon_lat_level_name={names} needs "
                                   + ("[lon, lat, a, b] for grid_type: sigma" if grid_type == "sigma"
                                      else "[lon, lat, pressure]"))
    with xr.open_dataset(path) as ds:
        missing = [n for n in names if n not in ds]
        if missing:
            raise PostBlockConfigError(f"{key}={path}: has no {missing} "
                                       f"(post_conf.global_mass_fixer.lon_lat_level_name)")
        field_of = {n: torch.from_numpy(ds[n].values).float() for n in names}
    lon, lat = field_of[names[0]], field_of[names[1]]
    midpoint = bool(mass.get("midpoint", False))
    if grid_type == "sigma":
        return ColumnPhysics(lon, lat, midpoint=midpoint, coef_a=field_of[names[2]], coef_b=field_of[names[3]],
                             deterministic=deterministic)
    return ColumnPhysics(lon, lat, midpoint=midpoint, pressure=field_of[names[2]], deterministic=deterministic)


def physics_field(path: Path, name: str, key: str, names_key: str) -> torch.Tensor:
    """One variable of the physics file `path` (the config's `key`), e.g. surface
    geopotential, float32."""
    with xr.open_dataset(path) as ds:
        if name not in ds:
            raise PostBlockConfigError(f"{key}={path}: has no {name!r} ({names_key})")
        return torch.from_numpy(ds[name].values).float()


def active_fixers(post_conf: Mapping[str, Any] | None) -> tuple[list[str], list[str]]:
    """The fixers a `post_conf` turns on, in CREDIT's order: (inside the model's forward,
    `activate_outside_model`). One error naming a module that acts on the forecast and is
    not built here, or CREDIT's `simple_demo` grid (its unit tests' stand-in for a physics file)."""
    if not post_conf or not post_conf.get("activate", False):
        return [], []
    other = [m for m in OTHER_MODULES if (post_conf.get(m) or {}).get("activate", False)]
    if other:
        raise PostBlockConfigError(f"post_conf.{other[0]} is active: credit builds CREDIT's {', '.join(FIXERS)} "
                                   f"post blocks, not {other[0]}")
    active = [m for m in FIXERS if (post_conf.get(m) or {}).get("activate", False)]
    demo = [m for m in active if m != "tracer_fixer" and post_conf[m].get("simple_demo", False)]
    if demo:
        raise PostBlockConfigError(f"post_conf.{demo[0]}.simple_demo=true: CREDIT then uses a 10x18 demo grid "
                                   f"instead of the physics file; set it false")
    outside = [m for m in active if m != "tracer_fixer" and post_conf[m].get("activate_outside_model", False)]
    return [m for m in active if m not in outside], outside
