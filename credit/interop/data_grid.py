"""The grid of the data a CREDIT config file names, read before its model section is built, so
that a model grid other than the data's is one line naming both (not the window-tiling message
of a model built on a grid its windows do not divide)."""

from __future__ import annotations

import glob
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from credit.data.catalog import LAT_NAMES, LON_NAMES, open_store

_FILE_KEYS = ("data.credit.files.prognostic", "data.credit.files.upper_air", "data.credit.files.surface")


def data_grid(overrides: Sequence[str]) -> tuple[tuple[int, int], str] | None:
    """((latitudes, longitudes), the file) of the first state file the mapped `overrides` name;
    None when none is named or readable (the dataset then says why)."""
    for key in _FILE_KEYS:
        value = next((o.split("=", 1)[1] for o in overrides if o.startswith(f"{key}=")), None)
        if not value or value == "null":
            continue
        pattern = re.sub(r"%[A-Za-z]", "*", value.strip("'"))
        for path in sorted(glob.glob(pattern))[:1]:
            try:
                ds = open_store(Path(path), cache=False)
            except (OSError, ValueError):
                return None
            try:
                lat = next((n for n in LAT_NAMES if n in ds.sizes), None)
                lon = next((n for n in LON_NAMES if n in ds.sizes), None)
                return ((ds.sizes[lat], ds.sizes[lon]), path) if lat and lon else None
            finally:
                ds.close()
    return None


def grid_mismatch(model: Mapping[str, Any], overrides: Sequence[str]) -> str | None:
    """One line when the model section's image_height x image_width (where set) is not the
    data's grid; None otherwise."""
    found = data_grid(overrides)
    if found is None:
        return None
    (lat, lon), path = found
    height, width = model.get("image_height"), model.get("image_width")
    if (height is None or int(height) == lat) and (width is None or int(width) == lon):
        return None
    return (f"model.image_height x image_width = {height} x {width}, but the data ({path}) are on a {lat} x {lon} "
            f"grid (latitude x longitude): CREDIT builds the model on the data's grid; set them to {lat} and {lon} "
            "(with a padding_conf whose padded grid the windows tile)")
