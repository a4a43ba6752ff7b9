"""One CF-1.8 netCDF file per init time: the forecast in physical units.

Upper-air variables are (lead_time, level, latitude, longitude), surface and diagnostic ones
(lead_time, latitude, longitude); `init_time` is a scalar coordinate and `valid_time` a
coordinate along `lead_time`. Variable and coordinate attributes (units, long_name,
standard_name, ...) are copied from the input files, so the forecast describes itself the
way the data do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xarray as xr
from omegaconf import DictConfig

from credit.data import role_files
from credit.data.catalog import HOUR_NS, LAT_NAMES, LON_NAMES, open_store

_TIME_UNITS = "hours since 1900-01-01 00:00:00"
_OUTPUT_ROLES = ("upper_air", "surface", "diagnostic")


@dataclass
class InputAttributes:
    """Attributes found in the input files: per variable, and per output coordinate name."""

    variables: dict[str, dict[str, object]] = field(default_factory=dict)
    coordinates: dict[str, dict[str, object]] = field(default_factory=dict)


def input_attributes(data: DictConfig) -> InputAttributes:
    """The attributes of every output variable and of latitude/longitude/level in the files
    of `data` (the first file of a role that holds the variable)."""
    found = InputAttributes()
    for role in _OUTPUT_ROLES:
        wanted = [v for v in data.variables[role] if v not in found.variables]
        for path in role_files(data, role) if wanted else []:
            with open_store(path, cache=False) as ds:  # netCDF or zarr
                for name in [v for v in wanted if v in ds.data_vars and v not in found.variables]:
                    found.variables[name] = dict(ds[name].attrs)
                for out, candidates in (("latitude", LAT_NAMES), ("longitude", LON_NAMES),
                                        ("level", (data.level_dim,))):
                    hit = next((c for c in candidates if c in ds.coords), None)
                    if hit is not None and out not in found.coordinates:
                        found.coordinates[out] = dict(ds[hit].attrs)
            if all(v in found.variables for v in wanted):
                break
    return found


def forecast_dataset(
    values: np.ndarray,
    *,
    init: int,
    step: int,
    upper_air: Sequence[str],
    levels: Sequence[float],
    flat: Sequence[str],
    latitude: np.ndarray,
    longitude: np.ndarray,
    attributes: InputAttributes,
    global_attrs: Mapping[str, str],
) -> xr.Dataset:
    """(lead, channel, lat, lon) physical `values` in the dataset's channel order (upper-air
    variables level by level, then `flat` surface and diagnostic ones) as a CF dataset; an
    ensemble's (lead, member, channel, lat, lon) gets CF's `realization` dimension first."""
    members = values.shape[1] if values.ndim == 5 else None
    if members is not None:
        values = np.moveaxis(values, 1, 0)  # (member, lead, channel, lat, lon)
    lead_axis = ("realization", "lead_time") if members is not None else ("lead_time",)
    leads = np.arange(1, values.shape[len(lead_axis) - 1] + 1) * np.timedelta64(int(step), "ns")
    init_time = np.datetime64(int(init), "ns")
    coords = {
        "lead_time": ("lead_time", leads, {"long_name": "forecast lead time",
                                            "standard_name": "forecast_period"}),
        "valid_time": ("lead_time", init_time + leads, {"long_name": "valid time",
                                                        "standard_name": "time"}),
        "init_time": ((), init_time, {"long_name": "initialization time",
                                      "standard_name": "forecast_reference_time"}),
        "level": ("level", np.asarray(levels, np.float64), attributes.coordinates.get("level", {})),
        "latitude": ("latitude", np.asarray(latitude, np.float64),
                     attributes.coordinates.get("latitude", {"units": "degrees_north"})),
        "longitude": ("longitude", np.asarray(longitude, np.float64),
                      attributes.coordinates.get("longitude", {"units": "degrees_east"})),
    }
    if not upper_air:
        del coords["level"]
    if members is not None:
        coords["realization"] = ("realization", np.arange(members, dtype=np.int32),
                                 {"long_name": "ensemble member", "standard_name": "realization"})
    data_vars = {}
    n_levels = len(levels)
    for i, name in enumerate(upper_air):
        block = values[..., i * n_levels:(i + 1) * n_levels, :, :].astype(np.float32)
        data_vars[name] = ((*lead_axis, "level", "latitude", "longitude"), block,
                           attributes.variables.get(name, {}))
    offset = len(upper_air) * n_levels
    for j, name in enumerate(flat):
        data_vars[name] = ((*lead_axis, "latitude", "longitude"),
                           values[..., offset + j, :, :].astype(np.float32), attributes.variables.get(name, {}))
    return xr.Dataset(data_vars, coords=coords, attrs={"Conventions": "CF-1.8", **global_attrs})


def write_forecast(ds: xr.Dataset, path: Path, *, complevel: int, overwrite: bool) -> None:
    """Write `ds` to `path` (float32 variables, zlib at `complevel`, 0: none). The file appears
    only once complete; an existing one is replaced only when `overwrite`."""
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass rollout.overwrite=true to replace it")
    step = int(ds["lead_time"].values[0].astype("timedelta64[ns]").astype(np.int64))
    lead_units = "hours" if step % HOUR_NS == 0 else "minutes"
    encoding: dict[str, dict[str, object]] = {
        "lead_time": {"units": lead_units, "dtype": "int32", "_FillValue": None},
        "valid_time": {"units": _TIME_UNITS, "calendar": "proleptic_gregorian", "_FillValue": None},
        "init_time": {"units": _TIME_UNITS, "calendar": "proleptic_gregorian", "_FillValue": None},
        "latitude": {"_FillValue": None},
        "longitude": {"_FillValue": None},
    }
    for coordinate in ("level", "realization"):
        if coordinate in ds.coords:
            encoding[coordinate] = {"_FillValue": None}
    for name in ds.data_vars:
        encoding[name] = {"dtype": "float32", "zlib": complevel > 0,
                          **({"complevel": complevel} if complevel > 0 else {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".partial_{path.name}")
    ds.to_netcdf(partial, engine="netcdf4", encoding=encoding)
    os.replace(partial, path)
