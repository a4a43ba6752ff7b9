"""`credit data generate --like` for a gen2 file with a `tisr` source: nothing to write for its
field (it is computed), but its total solar irradiance table where the copy finds it, its
training values for the normaliser's statistics, and its grid in the copy.

The table: CREDIT's own (`credit/metadata/` of the CREDIT checkout holding the file) copied to
`DIR/credit/metadata/`, beside the copy, where `credit train --credit-config DIR/FILE` looks; a
file outside a checkout gets a constant 1361 W m-2 table there instead (synthetic, as the data).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from credit.interop.tisr import TSI_TABLE, find_tsi_table, integrated, read_tsi_table, grid_from_specs


def place_table(source_file: Path, out: Path) -> tuple[Path, str]:
    """The table beside the copy in `out`, and what it is."""
    target = out / "credit" / "metadata" / TSI_TABLE
    target.parent.mkdir(parents=True, exist_ok=True)
    found = find_tsi_table(source_file)
    if found is not None:
        shutil.copyfile(found, target)
        return target, f"CREDIT's, from {found}"
    years = np.arange(1850.5, 2300.5, 1.0, dtype=np.float32)
    xr.Dataset({"tsi": ("time", np.full(len(years), 1361.0, np.float32))},
               coords={"time": ("time", years, {"units": "years since 0000-1-1"})},
               attrs={"title": "a constant total solar irradiance (no CREDIT checkout beside the file)"}
               ).to_netcdf(target)
    return target, "a constant 1361 W m-2 (no CREDIT checkout holds the file)"


def resized_specs(src: Mapping[str, Any], grid: tuple[int, int]) -> dict[str, Any]:
    """The tisr source's `lat_spec`, `lon_spec` on `grid`: latitude between the same ends,
    longitude over the same span plus one step (a periodic axis)."""
    lat0, lat1, _ = src["lat_spec"]
    lon0, lon1, n = src["lon_spec"]
    step = (float(lon1) - float(lon0)) / max(int(n) - 1, 1)
    span = float(lon1) - float(lon0) + step
    return {"lat_spec": [lat0, lat1, grid[0]], "lon_spec": [lon0, float(lon0) + span * (grid[1] - 1) / grid[1], grid[1]]}


def training_values(src: Mapping[str, Any], grid: tuple[int, int], times: Sequence[pd.Timestamp],
                    step: pd.Timedelta, table: Path) -> np.ndarray:
    """The field at the generated training times on the copy's grid (for its statistics)."""
    specs = resized_specs(src, grid) if src.get("lat_spec") is not None else {
        "lat_spec": [90, -90, grid[0]], "lon_spec": [0, 360 - 360 / grid[1], grid[1]]}
    lat, lon = grid_from_specs(specs["lat_spec"], specs["lon_spec"], "tisr")
    tsi_times, tsi = read_tsi_table(table)
    steps = int(src.get("num_integration_steps", 360))
    return np.stack([integrated(t, step, steps, lat, lon, tsi_times, tsi).numpy() for t in times])


def grid_file(out: Path, lat: np.ndarray, lon: np.ndarray) -> Path:
    """A `latlon_grid_path` file with the generated grid."""
    path = out / "tisr_grid" / "latlon.nc"
    path.parent.mkdir(parents=True, exist_ok=True)
    xr.Dataset(coords={"latitude": lat, "longitude": lon}).to_netcdf(path)
    return path
