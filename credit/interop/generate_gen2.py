"""Write the synthetic atmosphere of :mod:`credit.data.generate` in NCAR CREDIT's **gen2** layout.

As for gen1 (:mod:`credit.interop.generate_gen1`, whose helpers this module shares), the
toy atmosphere is simulated once into a temporary folder and re-laid with xarray. Files in ``out``:

* ``ERA5_gen2_6h_{YYYY}.nc`` (or ``.zarr`` with ``file_format="zarr"``): one all-in-one store
  per year, upper-air ``U V T Q`` on (time, level, latitude, longitude), ``SP t2m`` and the
  dynamic forcing ``tsi`` on (time, latitude, longitude), float32;
* ``static.nc``: ``Z_GDS4_SFC`` (in m2 s-2, as stored by ERA5) and ``LSM`` (0/1);
* ``mean_6h_{Y0}_{Y1}.nc`` / ``std_6h_{Y0}_{Y1}.nc``: the era5_normalizer's statistics over the
  training years, upper-air variables on ``level`` (the data's levels, in the data's order) and
  scalars for ``SP t2m tsi Z_GDS4_SFC`` (so the normaliser z-scores the surface geopotential; ``LSM``
  has none and passes through as stored, as CREDIT's normaliser passes it);
* ``credit.yml``: a CREDIT gen2 config (``data.source.ERA5``, ``validation_data``, ``preblocks``
  era5_normalizer + concat, a small ``crossformer``, the flat loss keys, ``trainer`` with
  ``parallelism``, ``inference``) with absolute paths into ``out``.

CREDIT's gen2 master clock reads every time from ``start_datetime`` to ``end_datetime``: the
training period is the training years' times, so with ``days_per_year`` it must be one year.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import xarray as xr

from credit.data.generate import (FORCING, FORMATS, STATIC, SURFACE, UPPER_AIR, GenerateError, checked_arguments,
                                  generate_dataset, prepare_output_dir, write_atomically)
from credit.interop.generate_gen1 import CONFIG_FILE, crossformer_section, statistics_dataset, write_credit_config

DATA_PREFIX = "ERA5_gen2_6h_"
STATIC_FILE = "static.nc"
_TMP_PREFIX = ".credit_gen2_tmp_"


def generate_credit_gen2(out: str | Path, *, grid: tuple[int, int] = (32, 64), years: Sequence[int] = (2000, 2001),
                         levels: Sequence[float] = (300, 500, 700, 850), train_years: Sequence[int] | None = None,
                         seed: int = 0, days_per_year: int | None = None, progress: bool = True,
                         overwrite: bool = False, file_format: str = "netcdf") -> Path:
    """Write the synthetic dataset in CREDIT's gen2 layout plus ``credit.yml`` into ``out``; return ``out``.

    Arguments as for :func:`credit.interop.generate_gen1.generate_credit_gen1` (the same
    arrays); ``file_format`` is ``netcdf`` or ``zarr`` for the yearly stores. Raises
    :class:`GenerateError` for invalid arguments, a non-empty ``out`` without ``overwrite``, and
    periods CREDIT's master clock could not read (consecutive years; with ``days_per_year``, one
    training year and one validation year)."""
    grid, years, levels, train_years = checked_arguments(grid, years, levels, train_years, days_per_year)
    if file_format not in FORMATS:
        raise GenerateError(f"file_format {file_format!r}: one of {list(FORMATS)}")
    valid_years = [y for y in years if y not in train_years] or train_years[-1:]
    for name, chosen in (("train_years", train_years), ("validation years", valid_years)):
        if chosen != list(range(chosen[0], chosen[-1] + 1)):
            raise GenerateError(f"{name} {chosen} must be consecutive years: CREDIT's gen2 master clock reads "
                                "every time from start_datetime to end_datetime")
        if days_per_year is not None and len(chosen) > 1:
            raise GenerateError(f"{name} {chosen} with --days-per-year {days_per_year}: the days between the years "
                                "are missing, and CREDIT's gen2 master clock reads every time of its period; "
                                "give one year")
    model = crossformer_section(grid, len(levels))
    out = Path(out).expanduser().resolve()
    suffix = FORMATS[file_format]
    written = (f"{DATA_PREFIX}*{suffix}", STATIC_FILE, "mean_6h_*.nc", "std_6h_*.nc", CONFIG_FILE, "*.tmp",
               f"{_TMP_PREFIX}*")
    prepare_output_dir(out, overwrite, written=written)

    last_times: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix=_TMP_PREFIX, dir=out) as tmp:
        ours = generate_dataset(Path(tmp) / "dataset", grid=grid, years=years, levels=levels,
                                train_years=train_years, seed=seed, progress=progress,
                                days_per_year=days_per_year)
        level = None
        for year in years:
            with xr.open_dataset(ours / f"era5_{year}.nc") as era5, xr.open_dataset(ours / f"forcing_{year}.nc") as f:
                ds = xr.merge([era5.load(), f.load()], compat="identical", join="exact", combine_attrs="override")
            level = ds["level"]
            last_times[year] = str(ds["time"].values[-1].astype("datetime64[s]"))
            ds.attrs.update(layout="NCAR CREDIT gen2 all-in-one yearly store", year=np.int32(year))
            write_atomically(ds[list(UPPER_AIR + SURFACE + FORCING)], out / f"{DATA_PREFIX}{year:04d}{suffix}")
        with xr.open_dataset(ours / "mean.nc") as m, xr.open_dataset(ours / "std.nc") as s:
            mean, std = m.load(), s.load()
        with xr.open_dataset(ours / "static.nc") as st:
            static = st.load()

    static_out = xr.Dataset({name: static[name] for name in STATIC})
    static_out.attrs.update(layout="NCAR CREDIT gen2 static store")
    write_atomically(static_out, out / STATIC_FILE)
    stats_tag = f"6h_{train_years[0]:04d}_{train_years[-1]:04d}"
    for name, ds in (("mean", mean), ("std", std)):
        stats = statistics_dataset(ds, level, name, train_years)
        stats["Z_GDS4_SFC"] = ((), np.float64(ds["Z_GDS4_SFC"].values), ds["Z_GDS4_SFC"].attrs)
        write_atomically(stats, out / f"{name}_{stats_tag}.nc")

    periods = {"train": (f"{train_years[0]:04d}-01-01T00:00:00", last_times[train_years[-1]]),
               "valid": (f"{valid_years[0]:04d}-01-01T00:00:00", last_times[valid_years[-1]])}
    write_credit_config(out, _config(out, seed, periods, level, model, stats_tag, suffix), "gen2")
    return out


def _config(out: Path, seed: int, periods: dict[str, tuple[str, str]], level: xr.DataArray, model: dict,
            stats_tag: str, suffix: str) -> dict:
    """The CREDIT gen2 config (key names as in CREDIT's gen2 example configs), absolute paths."""
    data_path = str(out / f"{DATA_PREFIX}%Y{suffix}")
    source = {
        "ERA5": {
            "dataset_type": "local",
            "level_coord": "level",
            "levels": [float(v) for v in level.values],
            "variables": {
                "prognostic": {"vars_3D": list(UPPER_AIR), "vars_2D": list(SURFACE), "path": data_path},
                "diagnostic": None,
                "dynamic_forcing": {"vars_2D": list(FORCING), "path": data_path},
                "static": {"vars_2D": list(STATIC), "path": str(out / STATIC_FILE)},
            },
        },
    }

    def section(span: tuple[str, str]) -> dict:  # CREDIT's validation_data repeats every data key
        return {"source": copy.deepcopy(source), "start_datetime": span[0], "end_datetime": span[1], "timestep": "6h",
                "history_len": 1, "forecast_len": 1}

    mean_path, std_path = str(out / f"mean_{stats_tag}.nc"), str(out / f"std_{stats_tag}.nc")
    return {
        "save_loc": str(out / "credit_run"),
        "seed": int(seed),
        "data": section(periods["train"]),
        "validation_data": section(periods["valid"]),
        "trainer": {
            "type": "gen2",
            "parallelism": {"data": "none", "tensor": 1, "domain": 1},
            "activation_checkpoint": False,
            "load_weights": False,
            "load_optimizer": False,
            "load_scaler": False,
            "load_scheduler": False,
            "reload_epoch": False,
            "learning_rate": 1.0e-3,
            "weight_decay": 0,
            "train_batch_size": 2,
            "valid_batch_size": 2,
            "batches_per_epoch": 10,
            "valid_batches_per_epoch": 2,
            "start_epoch": 0,
            "epochs": 2,
            "num_epoch": 2,
            "use_ema": False,
            "use_scheduler": False,
            "amp": False,
            "grad_accum_every": 1,
            "grad_max_norm": 1.0,
            "thread_workers": 1,
            "valid_thread_workers": 1,
            "prefetch_factor": 2,
            "skip_validation": False,
            "save_best_weights": True,
        },
        "preblocks": {"per_step": {
            "norm": {"type": "era5_normalizer", "args": {"mean_path": mean_path, "std_path": std_path}},
            "concat": {"type": "concat"},
        }},
        "postblocks": {"per_step": {"reconstruct": {"type": "reconstruct", "args": {"detach": True}}}},
        "model": model,
        "loss": {
            "training_loss": "mse",
            "use_power_loss": False,
            "use_spectral_loss": False,
            "use_latitude_weights": True,
            "latitude_weights": str(out / STATIC_FILE),
            "use_variable_weights": False,
        },
        "inference": {
            "run_mode": "batch",
            "mode": "none",
            "save_forecast": str(out / "credit_run" / "forecasts"),
            "batch_forecast": {"forecast_length": "1d", "first_init_date": periods["valid"][0],
                               "last_init_date": periods["valid"][0], "init_interval": "24h"},
        },
    }
