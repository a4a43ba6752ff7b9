"""`credit data generate --like` for a gen2 file with `geopotential_diagnostic` postblocks: their
level coefficient file where the copy finds it.

A bare file name is one of CREDIT's package (`credit/metadata/` of the CREDIT checkout holding
the file): copied to `DIR/credit/metadata/`, beside the copy, where `credit train
--credit-config DIR/FILE` looks. Outside a checkout, or for a path that does not exist here, a
synthetic file in that layout (`a_half`, `b_half` on enough interfaces for the data's levels,
the top interface at 0 Pa as ERA5's) is written there instead, and the copy points at it.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from credit.interop.geopotential import LEVEL_INFO
from credit.interop.paths import expand, find_metadata_file


def blocks(conf: Mapping[str, Any]) -> list[dict]:
    """The args of the file's geopotential_diagnostic postblocks (its copy's, to edit in place)."""
    found = []
    for section in dict(conf.get("postblocks") or {}).values():
        for block in dict(section or {}).values():
            if isinstance(block, dict) and block.get("type") == "geopotential_diagnostic":
                found.append(block.setdefault("args", {}))
    return found


def place_level_info(conf: dict, source_file: Path, out: Path, data_levels: Sequence[float]) -> list[str]:
    """Each geopotential postblock's level file where the copy `conf` finds it; the lines saying what each is."""
    said = []
    for args in blocks(conf):
        name = expand(str(args.get("level_info_file", LEVEL_INFO)))
        bare = Path(name).name == name
        if not bare and Path(name).is_file():
            continue
        target = out / "credit" / "metadata" / Path(name).name
        target.parent.mkdir(parents=True, exist_ok=True)
        found = find_metadata_file(source_file, name) if bare else None
        if found is not None:
            shutil.copyfile(found, target)
            said.append(f"{name}: CREDIT's, from {found}")
        elif not target.is_file():
            levels = args.get("levels")
            interfaces = (max(int(v) for v in levels) if levels else len(data_levels)) + 1
            _synthetic(target, interfaces, str(args.get("model_a_half_var", "a_half")),
                       str(args.get("model_b_half_var", "b_half")))
            said.append(f"{name}: synthetic, {interfaces} interfaces (no CREDIT checkout holds the file)")
        if not bare:
            args["level_info_file"] = str(target)
    return said


def _synthetic(path: Path, interfaces: int, a_name: str, b_name: str) -> None:
    eta = np.linspace(0.0, 1.0, interfaces)
    b_half = np.clip((eta - 0.3) / 0.7, 0.0, None) ** 1.5  # pure pressure levels aloft, sigma near the surface
    a_half = 8.0e4 * eta * (1.0 - eta) ** 1.2
    xr.Dataset({a_name: ("half_level", a_half), b_name: ("half_level", b_half)},
               coords={"half_level": np.arange(1, interfaces + 1, dtype=np.int32)},
               attrs={"title": "synthetic hybrid level coefficients (credit data generate --like)"}).to_netcdf(path)
