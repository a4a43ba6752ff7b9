"""Sizes for seconds-long training runs on the tiny generated dataset (shared by all tests)."""

from __future__ import annotations

from pathlib import Path

TINY_LEVELS = [500, 850]
# `model.*` of the tiny windowformer as a mapping, for building it without hydra
SMALL_MODEL = dict(
    dim=[16, 32],
    depth=[1, 1],
    dim_head=8,
    local_window_size=[2, 2],
    global_window_size=[2, 2],
    cross_embed_kernel_sizes=[[2, 4], [2, 4]],
    cross_embed_strides=[2, 2],
)
TINY_MODEL = [
    "model=windowformer",
    "model.dim=[16,32]",
    "model.depth=[1,1]",
    "model.dim_head=8",
    "model.local_window_size=[2,2]",
    "model.global_window_size=[2,2]",
    "model.cross_embed_kernel_sizes=[[2,4],[2,4]]",
    "model.cross_embed_strides=[2,2]",
]


def tiny_overrides(data_root: Path | str, *extra: str) -> list[str]:
    """Overrides for the tiny model on the tiny dataset; later entries win."""
    return [*TINY_MODEL, *tiny_data_overrides(data_root, *extra)]


def tiny_data_overrides(data_root: Path | str, *extra: str) -> list[str]:
    """Overrides for the tiny dataset and short runs, the model left at its defaults."""
    return [
        f"data.root={data_root}",
        "data.generate_if_missing=false",
        f"data.levels=[{','.join(str(v) for v in TINY_LEVELS)}]",
        "data.train_period=[2000-01-01,2000-01-12]",
        "data.valid_period=[2001-01-01,2001-01-12]",
        "data.valid_samples=8",
        "trainer.batch_size=4",
        "trainer.progress_bar=false",
        "trainer.scheduler.warmup_steps=2",
        "trainer.optimizer.lr=2e-3",
        *extra,
    ]


def write_physics_file(data_root: Path | str, path: Path | str) -> Path:
    """A physics file for CREDIT's conservation post blocks on the tiny grid: 2-D longitude
    and latitude (`lon2d`, `lat2d`) from the dataset's static file, and the pressure of
    `TINY_LEVELS` in Pa (`p_level`)."""
    import numpy as np
    import xarray as xr

    with xr.open_dataset(Path(data_root) / "static.nc") as static:
        lon2d, lat2d = np.meshgrid(static.longitude.values, static.latitude.values)
    grid = ("latitude", "longitude")
    xr.Dataset({"lon2d": (grid, lon2d), "lat2d": (grid, lat2d),
                "p_level": (("level",), 100.0 * np.array(TINY_LEVELS, dtype=np.float64))}).to_netcdf(path)
    return Path(path)


def post_block_overrides(physics_file: Path | str, *, outside: bool, tracer_min: float = 250.0) -> list[str]:
    """CREDIT's tracer fixer (on T: at least `tracer_min`) and pressure-level mass fixer (on
    Q, every level rescaled; `outside`: after the model, as CREDIT's trainer runs it)."""
    fixer = "model.post_conf.global_mass_fixer"
    return ["model.post_conf.activate=true", "model.post_conf.tracer_fixer.activate=true",
            "model.post_conf.tracer_fixer.tracer_name=[T]", f"model.post_conf.tracer_fixer.tracer_thres=[{tracer_min}]",
            f"{fixer}.activate=true", f"{fixer}.activate_outside_model={str(outside).lower()}",
            f"{fixer}.fix_level_num={len(TINY_LEVELS)}", f"{fixer}.lon_lat_level_name=[lon2d,lat2d,p_level]",
            f"{fixer}.specific_total_water_name=[Q]", f"data.physics_file={physics_file}"]
