"""Write the synthetic atmosphere of :mod:`credit.data.generate` in NCAR CREDIT's **gen1** layout.

The toy atmosphere is simulated once by :func:`credit.data.generate.generate_dataset` into a
temporary sub folder of ``out``; its files are then re-laid with xarray (no second simulation code)
into the file layout that CREDIT's gen1 ERA5 pipeline reads (``credit.parser.training_data_check``,
``credit.datasets.gen_1`` with ``ERA5_MultiStep_Batcher`` and ``scaler_type: std_new``), plus a
CREDIT gen1 config file ``credit.yml`` for it. Files written into ``out``:

* ``ERA5_gen1_6h_{YYYY}.nc``  one all-in-one file per year: upper-air ``U V T Q`` (time, level,
  latitude, longitude), surface ``SP t2m`` and the dynamic forcing ``tsi`` (time, latitude,
  longitude), all float32; latitude 90 .. -90, time as int64 "hours since 1900-01-01"
* ``static.nc``  ``Z_GDS4_SFC`` (z-scored, see below) and ``LSM`` (0/1) on (latitude, longitude)
* ``mean_6h_{Y0}_{Y1}.nc`` / ``std_6h_{Y0}_{Y1}.nc``  float64 statistics over the training years
  Y0..Y1: upper-air variables on ``level`` (the data's level coordinate), scalars for SP, t2m, tsi
* ``latitude_weights.nc``  ``coslat`` (latitude, longitude) with the data's coordinates
* ``credit.yml``  the CREDIT gen1 config (data, model: a small ``crossformer``, loss, trainer, predict)

CLI: ``credit data generate --layout credit-gen1 ...`` calls :func:`generate_credit_gen1`.
"""

from __future__ import annotations

import glob
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import xarray as xr
import yaml

from credit.data.generate import (FORCING, STATIC, SURFACE, UPPER_AIR, GenerateError, checked_arguments,
                                  generate_dataset, prepare_output_dir, write_atomically)

DATA_PREFIX = "ERA5_gen1_6h_"
"""Yearly file names are ``{DATA_PREFIX}{YYYY}.nc``."""
STATIC_FILE = "static.nc"
LATW_FILE = "latitude_weights.nc"
CONFIG_FILE = "credit.yml"
_TMP_PREFIX = ".credit_gen1_tmp_"
_WRITTEN = (f"{DATA_PREFIX}*.nc", STATIC_FILE, "mean_6h_*.nc", "std_6h_*.nc", LATW_FILE, CONFIG_FILE, "*.tmp")
_LATW_COLUMN = 10  # CREDIT's VariableTotalLoss2D takes the latitude weights at longitude column 10


def generate_credit_gen1(out: str | Path, *, grid: tuple[int, int] = (32, 64), years: Sequence[int] = (2000, 2001),
                         levels: Sequence[float] = (300, 500, 700, 850), train_years: Sequence[int] | None = None,
                         seed: int = 0, days_per_year: int | None = None, progress: bool = True,
                         overwrite: bool = False) -> Path:
    """Write the synthetic dataset in CREDIT's gen1 layout plus ``credit.yml`` into ``out``; return ``out``.

    The arguments mean what they mean for :func:`credit.data.generate.generate_dataset` (same
    defaults; identical arguments give the same arrays as that function): ``train_years`` (default:
    all years but the last, or the only year) are the years of the statistics and of CREDIT's
    ``train_years``; the other years are CREDIT's ``valid_years`` (with a single year, that year is
    both, which CREDIT allows). The values are those of :func:`generate_dataset`, re-laid:

    * the yearly files hold its ``era5_YYYY`` and ``forcing_YYYY`` variables unchanged;
    * mean/std are its ``mean.nc``/``std.nc`` values (population mean/std over time, latitude and
      longitude of the training years, per level for upper-air variables, accumulated in float64 and
      stored by it in float32) written as float64, without the static variables;
    * CREDIT does not normalise static variables, so ``Z_GDS4_SFC`` (surface geopotential, 0 to
      ~2e4 m2 s-2 in the generator) is written **z-scored** with the generator's spatial mean/std of
      it (kept in the variable's ``normalisation_mean``/``normalisation_std`` attributes); ``LSM`` is
      already 0/1 and is written unchanged.

    ``credit.yml`` has absolute paths into ``out`` (``save_loc`` is ``out/credit_run``); it has no
    ``pbs`` section (site-specific: add one to submit through CREDIT's PBS launcher).

    Raises :class:`GenerateError` for invalid arguments, for a non-empty ``out`` without
    ``overwrite`` (with it, only files this function writes are replaced), and where CREDIT could not
    use the result: training and validation years must each be consecutive years (CREDIT expects a
    file for every year in ``[first, last + 1)``); both grid sizes must be multiples of 8 (CREDIT's
    CrossFormer halves the grid three or four times and its decoder must meet the same sizes) and at
    least 16 longitudes (CREDIT's latitude weighting reads longitude column 10); ``out`` must not
    contain a year string that makes CREDIT's year filter (a substring test on the whole path) pick
    the wrong files.
    """
    grid, years, levels, train_years = checked_arguments(grid, years, levels, train_years, days_per_year)
    valid_years = [y for y in years if y not in train_years] or train_years[-1:]
    for name, chosen in (("train_years", train_years), ("validation years", valid_years)):
        if chosen != list(range(chosen[0], chosen[-1] + 1)):
            raise GenerateError(f"{name} {chosen} must be consecutive years: CREDIT's gen1 year ranges "
                                "[first, last + 1) need one file per year")
    model = crossformer_section(grid, len(levels))
    if grid[1] < _LATW_COLUMN + 1:
        raise GenerateError(f"grid {grid[0]}x{grid[1]}: CREDIT's latitude weighting needs at least "
                            f"{_LATW_COLUMN + 1} longitudes")
    out = Path(out).expanduser().resolve()
    data_files = {y: out / f"{DATA_PREFIX}{y:04d}.nc" for y in years}
    _check_credit_year_filter(data_files, train_years, valid_years)
    prepare_output_dir(out, overwrite, written=_WRITTEN + (f"{_TMP_PREFIX}*",))

    with tempfile.TemporaryDirectory(prefix=_TMP_PREFIX, dir=out) as tmp:
        ours = generate_dataset(Path(tmp) / "dataset", grid=grid, years=years, levels=levels,
                                train_years=train_years, seed=seed, progress=progress,
                                days_per_year=days_per_year)
        level = None
        for year, path in data_files.items():
            with xr.open_dataset(ours / f"era5_{year}.nc") as era5, xr.open_dataset(ours / f"forcing_{year}.nc") as f:
                ds = xr.merge([era5.load(), f.load()], compat="identical", join="exact", combine_attrs="override")
            level = ds["level"]
            ds.attrs.update(layout="NCAR CREDIT gen1 all-in-one yearly file", year=np.int32(year))
            write_atomically(ds[list(UPPER_AIR + SURFACE + FORCING)], path)
        with xr.open_dataset(ours / "mean.nc") as m, xr.open_dataset(ours / "std.nc") as s:
            mean, std = m.load(), s.load()
        with xr.open_dataset(ours / "static.nc") as st:
            static = st.load()

    write_atomically(_static(static, mean, std), out / STATIC_FILE)
    stats_tag = f"6h_{train_years[0]:04d}_{train_years[-1]:04d}"
    for name, ds in (("mean", mean), ("std", std)):
        write_atomically(statistics_dataset(ds, level, name, train_years), out / f"{name}_{stats_tag}.nc")
    write_atomically(_latitude_weights(static), out / LATW_FILE)

    write_credit_config(out, _config(out, seed, train_years, valid_years, level, model, stats_tag), "gen1")
    return out


def write_credit_config(out: Path, conf: dict, schema: str) -> None:
    """`out`/credit.yml: the config CREDIT's `applications/train_{schema}.py` trains on."""
    text = yaml.safe_dump(conf, sort_keys=False, default_flow_style=False)
    (out / CONFIG_FILE).write_text(
        f"# Written by `credit data generate --layout credit-{schema}`: NCAR CREDIT {schema} config for the "
        f"synthetic\n# dataset in {out} (train on it with CREDIT's applications/train_{schema}.py -c "
        f"{out / CONFIG_FILE}).\n" + text)


def crossformer_section(grid: tuple[int, int], n_levels: int) -> dict:
    """A small CREDIT ``crossformer`` model section whose windows and strides fit ``grid``.

    CREDIT's CrossFormer runs four stride-s cross-embed stages; its decoder upsamples 2x three times
    and concatenates with the stage outputs, so stages 2-4 must halve exactly (sizes even), and the
    last upsampling (2x) is interpolated back to the grid (``interp``). Every stage size must be
    divisible by the local window and by that stage's global window.
    """
    n_lat, n_lon = grid
    if n_lat % 16 == 0 and n_lon % 16 == 0:
        first_stride, first_kernels = 2, [4, 8, 16, 32]  # CREDIT's example: kernels even for stride 2
    elif n_lat % 8 == 0 and n_lon % 8 == 0:
        first_stride, first_kernels = 1, [3, 5, 7, 9]  # stride 1 keeps the size with odd kernels
    else:
        raise GenerateError(f"grid {n_lat}x{n_lon}: CREDIT's CrossFormer needs both sizes to be multiples of 8 "
                            "(of 16 for its usual stride 2 first stage)")
    strides = [first_stride, 2, 2, 2]
    stages, h, w = [], n_lat, n_lon
    for s in strides:
        h, w = h // s, w // s
        stages.append((h, w))
    local = next(k for k in (4, 2, 1) if all(a % k == 0 and b % k == 0 for a, b in stages))
    global_sizes = [next(g for g in range(max(min(a, b) // 2, 1), 0, -1) if a % g == 0 and b % g == 0)
                    for a, b in stages]
    return {
        "type": "crossformer",
        "frames": 1,
        "image_height": n_lat,
        "image_width": n_lon,
        "levels": n_levels,
        "channels": len(UPPER_AIR),
        "surface_channels": len(SURFACE),
        "input_only_channels": len(FORCING) + len(STATIC),
        "output_only_channels": 0,
        "patch_height": 1,
        "patch_width": 1,
        "frame_patch_size": 1,
        "dim": [32, 64, 128, 256],
        "depth": [2, 2, 2, 2],
        "dim_head": 16,
        "global_window_size": global_sizes,
        "local_window_size": local,
        "cross_embed_kernel_sizes": [first_kernels, [2, 4], [2, 4], [2, 4]],
        "cross_embed_strides": strides,
        "attn_dropout": 0.0,
        "ff_dropout": 0.0,
        "upsample_v_conv": True,
        "use_spectral_norm": True,
        "interp": True,
        "padding_conf": {"activate": False},
        "post_conf": {"activate": False},
    }


def _check_credit_year_filter(data_files: dict[int, Path], train_years: list[int], valid_years: list[int]) -> None:
    """Raise unless CREDIT's year filter (``any(str(year) in path)`` over ``range(a, b)``) picks exactly the
    files of each split, in year order."""
    paths = sorted(str(p) for p in data_files.values())
    for name, chosen in (("train", train_years), ("valid", valid_years)):
        wanted = [str(data_files[y]) for y in chosen]
        picked = [p for p in paths if any(str(y) in p for y in range(chosen[0], chosen[-1] + 1))]
        if picked != wanted:
            raise GenerateError(f"CREDIT's year filter (a year-string test on the whole path) would pick {picked} "
                                f"for the {name} years {chosen}; choose an output path without year strings")


def _static(static: xr.Dataset, mean: xr.Dataset, std: xr.Dataset) -> xr.Dataset:
    """Static fields as a CREDIT user stores them (CREDIT does not normalise them): Z z-scored, LSM as is."""
    z = static["Z_GDS4_SFC"]
    mu, sigma = float(mean["Z_GDS4_SFC"]), float(std["Z_GDS4_SFC"])
    z_norm = ((z.astype(np.float64) - mu) / sigma).astype(np.float32)
    z_norm.attrs = dict(units="1", long_name="Surface geopotential, z-scored",
                        description="(Z_GDS4_SFC - normalisation_mean) / normalisation_std, in m2 s-2",
                        normalisation_mean=mu, normalisation_std=sigma)
    out = xr.Dataset({"Z_GDS4_SFC": z_norm, "LSM": static["LSM"]})
    out.attrs.update(layout="NCAR CREDIT gen1 static file (pre-normalised: CREDIT does not normalise statics)")
    return out


def statistics_dataset(ds: xr.Dataset, level: xr.DataArray, name: str, train_years: list[int]) -> xr.Dataset:
    """CREDIT's mean/std file: float64, upper-air on the data's ``level`` coordinate, scalars otherwise."""
    data = {k: (("level",), ds[k].values.astype(np.float64), ds[k].attrs) for k in UPPER_AIR}
    data |= {k: ((), np.float64(ds[k].values), ds[k].attrs) for k in SURFACE + FORCING}
    out = xr.Dataset(data, coords={"level": level.variable})
    out.attrs.update(statistic=name, train_years=np.asarray(train_years, np.int32),
                     description=f"{name} over time, latitude and longitude of the training years "
                                 f"{' '.join(map(str, train_years))} (per level for upper-air variables), "
                                 "from credit.data.generate's statistics")
    return out


def _latitude_weights(static: xr.Dataset) -> xr.Dataset:
    """``coslat`` on the data's grid (CREDIT recomputes cos(latitude) from the coordinate)."""
    lat, lon = static["latitude"], static["longitude"]
    coslat = np.cos(np.deg2rad(lat.values.astype(np.float64)))[:, None] * np.ones(lon.size)
    out = xr.Dataset({"coslat": (("latitude", "longitude"), coslat,
                                 dict(units="1", long_name="cosine of latitude"))},
                     coords={"latitude": lat.variable, "longitude": lon.variable})
    out.attrs.update(layout="NCAR CREDIT latitude weights file")
    return out


def _config(out: Path, seed: int, train_years: list[int], valid_years: list[int], level: xr.DataArray,
            model: dict, stats_tag: str) -> dict:
    """The CREDIT gen1 config (key names as in CREDIT's example config), with absolute paths into ``out``."""
    data_glob = f"{glob.escape(str(out))}/{DATA_PREFIX}*.nc"
    level_ids = [v.item() for v in level.values]
    return {
        "save_loc": str(out / "credit_run"),
        "seed": int(seed),
        "data": {
            "variables": list(UPPER_AIR),
            "save_loc": data_glob,
            "surface_variables": list(SURFACE),
            "save_loc_surface": data_glob,
            "dynamic_forcing_variables": list(FORCING),
            "save_loc_dynamic_forcing": data_glob,
            "diagnostic_variables": [],
            "forcing_variables": [],
            "static_variables": list(STATIC),
            "save_loc_static": str(out / STATIC_FILE),
            "mean_path": str(out / f"mean_{stats_tag}.nc"),
            "std_path": str(out / f"std_{stats_tag}.nc"),
            "train_years": [train_years[0], train_years[-1] + 1],  # CREDIT's end year is exclusive
            "valid_years": [valid_years[0], valid_years[-1] + 1],
            "scaler_type": "std_new",
            "history_len": 1,
            "valid_history_len": 1,
            "forecast_len": 0,
            "valid_forecast_len": 0,
            "lead_time_periods": 6,
            "skip_periods": 1,
            "static_first": True,
            "dataset_type": "ERA5_MultiStep_Batcher",
            "level_ids": level_ids,
            "levels": len(level_ids),
        },
        "model": model,
        "loss": {
            "training_loss": "mse",
            "validation_loss": "mae",
            "use_power_loss": False,
            "use_spectral_loss": False,
            "latitude_weights": str(out / LATW_FILE),
            "use_latitude_weights": True,
            "use_variable_weights": False,
        },
        "trainer": {
            "type": "era5-gen1",
            "mode": "none",
            "load_weights": False,
            "learning_rate": 1.0e-3,
            "weight_decay": 0,
            "train_batch_size": 2,
            "valid_batch_size": 2,
            "batches_per_epoch": 10,
            "valid_batches_per_epoch": 2,
            "start_epoch": 0,
            "epochs": 2,  # total epochs
            "num_epoch": 2,  # epochs run by one job (CREDIT's meaning): both in one job
            "grad_max_norm": 1.0,
            "amp": False,
            "activation_checkpoint": False,
            "use_scheduler": False,
            "thread_workers": 1,  # CREDIT's ERA5_MultiStep_Batcher needs exactly 1
            "valid_thread_workers": 1,
            "prefetch_factor": 2,
            "skip_validation": False,
            "save_best_weights": True,
            "use_ema": False,
        },
        "predict": {
            "mode": "none",
            "batch_size": 1,
            "forecasts": {
                "type": "custom",
                "start_year": valid_years[0],
                "start_month": 1,
                "start_day": 1,
                "start_hours": [0],
                "duration": 1,
                "days": 1,
            },
            "save_forecast": str(out / "credit_run" / "forecasts"),
        },
    }
