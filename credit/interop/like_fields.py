"""What `credit data generate --like` writes for either CREDIT schema: the synthetic fields,
where a file of the CREDIT config goes under the output folder, the model keys a new grid
sets, and the statistics of the generated training times."""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from credit.data.generate import GenerateError
from credit.interop.paths import expand


def wave_field(name: str, shape: tuple[int, ...], times: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(time, [level,] lat, lon) float32: offset + amplitude x (a wave moving east) + 5% noise,
    positive everywhere (a pressure or a humidity stays > 0)."""
    code = zlib.crc32(name.encode())
    amplitude, offset = 1.0 + code % 9, 3.0 * (1.0 + code % 9) + (code >> 8) % 50
    lat = np.linspace(0, np.pi, shape[-2])[:, None]
    lon = np.linspace(0, 2 * np.pi, shape[-1], endpoint=False)[None, :]
    hours = (times - times[0]).astype("timedelta64[h]").astype(np.float64)
    wave = np.stack([np.sin(lat) * np.cos(lon - 2 * np.pi * h / 96.0) for h in hours])
    if len(shape) == 4:
        wave = wave[:, None] * (1.0 + 0.1 * np.arange(shape[1]))[None, :, None, None]
    noise = 0.05 * rng.standard_normal(shape)
    return (offset + amplitude * (wave + noise)).astype(np.float32)


def placed(out: Path, path: Any, make: bool = True) -> Path:
    """Where a file of the CREDIT file goes under `out`: in a folder named as its own (CREDIT's
    stores sit in folders such as all_in_one/, static/, mean_std/ whose globs must not meet),
    which `make` creates."""
    path = Path(expand(str(path)))
    if make:
        (out / path.parent.name).mkdir(parents=True, exist_ok=True)
    return out / path.parent.name / path.name


def resized_model(model: Mapping[str, Any], grid: tuple[int, int]) -> dict[str, Any]:
    """The model section on `grid`: its size and, with boundary padding on, pads that make the
    padded grid a multiple of what every stage's windows need. Model-level `pad_lat` and
    `pad_lon` without a `padding_conf` (which CREDIT's parser turns into mirror padding of n
    rows each side) become that `padding_conf`, since new pads need not be even."""
    from credit.models.credit.layers import stage_multiple

    out: dict[str, Any] = {**model, "image_height": grid[0], "image_width": grid[1]}
    padding = dict(model.get("padding_conf") or {})
    if "padding_conf" not in model and "pad_lat" in model and "pad_lon" in model:
        padding = {"activate": True, "mode": "mirror"}
        del out["pad_lat"], out["pad_lon"]
    if not padding.get("activate"):
        return out
    dims = model.get("dim")
    stages = len(dims) if isinstance(dims, (list, tuple)) else 4
    local = model.get("local_window_size", 10)
    local = list(local) if isinstance(local, (list, tuple)) else [local] * stages
    strides = list(model.get("cross_embed_strides") or [2] * stages)
    multiple = stage_multiple(tuple(strides), tuple(local), tuple(model.get("global_window_size") or [1] * stages))
    multiple *= int(model.get("patch_height", 1))
    pads = []
    for size in grid:
        total = math.ceil(size / multiple) * multiple - size
        if total - total // 2 > size:
            raise GenerateError(f"--grid {grid[0]}x{grid[1]}: the model's windows need the padded grid to be a "
                                f"multiple of {multiple}, and the boundary padding cannot be wider than the grid; "
                                f"give at least {math.ceil(multiple / 3)} in each direction")
        pads.append([total // 2, total - total // 2])
    out["padding_conf"] = {**padding, "pad_lat": pads[0], "pad_lon": pads[1]}
    return out


def training_stats(values: np.ndarray, per_point: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std (float64) of a (time, [level,] lat, lon) field: per level, or one each; with
    `per_point` (a 2-D field scaled per grid point) one of each per (lat, lon) point, over time,
    where a point that does not vary takes the whole field's std (a scaler divides by it)."""
    if per_point:
        whole = values.std(dtype=np.float64)
        std = values.std(axis=0, dtype=np.float64)
        return values.mean(axis=0, dtype=np.float64), np.where(std > 0, std, whole if whole > 0 else 1.0)
    axes = (0, 2, 3) if values.ndim == 4 else tuple(range(values.ndim))
    return values.mean(axis=axes, dtype=np.float64), values.std(axis=axes, dtype=np.float64)


def model_grid(model: Mapping[str, Any], grid: tuple[int, int] | None, source: Path
               ) -> tuple[tuple[int, int], dict[str, Any] | None]:
    """The grid to write (`--grid`, or the model's) and the model section on it (None: the
    file's own grid, the section unchanged)."""
    if grid is None:
        if not model.get("image_height") or not model.get("image_width"):
            raise GenerateError(f"--like {source}: model.image_height/image_width unset; give --grid")
        grid = (int(model["image_height"]), int(model["image_width"]))
    same = grid == (model.get("image_height"), model.get("image_width"))
    return grid, None if same else resized_model(model, grid)
