"""The config-to-data adapter shared by training, rollout and checkpoint conversion:
`data.*` -> datasets (generating the embedded one on first use) -> the data layout the
model is built for."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch.distributed as dist
from omegaconf import DictConfig

from credit.interop.data_gen1 import CreditGen1Dataset
from credit.interop.data_gen2 import CreditGen2Dataset
from credit.interop.tisr import solar_source
from credit.data.dataset import ERA5Dataset, VariableSpec
from credit.data.generate import generate_dataset

log = logging.getLogger(__name__)


def variable_spec(data: DictConfig) -> VariableSpec:
    v = data.variables
    return VariableSpec(
        upper_air=tuple(v.upper_air),
        surface=tuple(v.surface),
        forcing=tuple(v.forcing),
        static=tuple(v.static),
        diagnostic=tuple(v.diagnostic),
    )


def ensure_dataset(data: DictConfig, is_main: bool) -> Path:
    """Return `data.root`, generating the embedded dataset there first when it is absent."""
    root = Path(data.root)
    present = root.is_dir() and any(root.glob(data.files.static))
    if not present and data.generate_if_missing:
        if is_main:
            gen = data.generate
            log.info("generating the embedded dataset in %s", root)
            generate_dataset(
                root,
                grid=tuple(gen.grid),
                years=list(gen.years),
                levels=list(data.levels),
                train_years=list(gen.train_years),
                seed=gen.seed,
            )
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
    return root


CREDIT_FILE_ROLE = {"forcing": "dynamic_forcing"}  # data.variables.forcing: CREDIT's dynamic forcing
CREDIT_GEN2_FILE_ROLE = {"upper_air": "prognostic", "surface": "prognostic", "forcing": "dynamic_forcing"}


def role_files(data: DictConfig, role: str) -> list[Path]:
    """The files of a variable role of `data` (`data.files` or, for CREDIT's layout,
    `data.credit.files`), sorted; DataError when there are none."""
    if data.layout == "credit-gen2":
        from credit.data.catalog import DataError
        from credit.interop.path_templates import template_files

        key = CREDIT_GEN2_FILE_ROLE.get(role, role)
        found = template_files(data.root, data.credit.files[key] or "") if data.credit.files[key] else []
        if not found:
            raise DataError(f"the CREDIT files of {key} ({data.credit.files[key]!r}) match no file")
        return [path for path, _, _ in found]
    if data.layout == "credit-gen1":
        from credit.interop.data_gen1 import layout_role_files

        key = CREDIT_FILE_ROLE.get(role, role)
        return layout_role_files(data.root, data.credit.files[key], key)
    from credit.data.catalog import resolve_glob

    return resolve_glob(Path(data.root), role, data.files[role])


def credit_gen1_dataset(data: DictConfig, period: tuple[str, str], forecast_len: int) -> CreditGen1Dataset:
    """`data.layout=credit-gen1`: CREDIT's files over `period` with `forecast_len` target steps."""
    v, credit = data.variables, data.credit
    return CreditGen1Dataset(
        data.root, files=dict(credit.files), upper_air=list(v.upper_air), surface=list(v.surface),
        dynamic_forcing=list(v.forcing), forcing=list(credit.forcing_file_variables), static=list(v.static),
        diagnostic=list(v.diagnostic), levels=list(data.levels), period=period, history_len=data.history_len,
        forecast_len=forecast_len, skip_periods=credit.skip_periods, static_first=credit.static_first,
        clamp=None if credit.clamp is None else list(credit.clamp),
    )


def credit_gen2_dataset(data: DictConfig, period: tuple[str, str], forecast_len: int) -> CreditGen2Dataset:
    """`data.layout=credit-gen2`: CREDIT's gen2 files over `period` with `forecast_len` target steps."""
    v, credit = data.variables, data.credit
    return CreditGen2Dataset(
        data.root, files=dict(credit.files), prognostic_3d=list(v.upper_air), prognostic_2d=list(v.surface),
        dynamic_forcing=list(v.forcing), static=list(v.static), diagnostic=list(v.diagnostic),
        levels=list(data.levels), period=period, timestep=credit.timestep, level_coord=credit.level_coord,
        stats_levels=None if credit.stats_levels is None else list(credit.stats_levels),
        history_len=data.history_len, forecast_len=forecast_len,
        clamp=None if credit.clamp is None else list(credit.clamp), source_name=credit.source_name,
        scaled=None if credit.scaled_variables is None else list(credit.scaled_variables),
        spatial=list(credit.spatial_variables),
        transforms=[dict(b) for b in credit.transforms], output_inverse=[dict(b) for b in credit.output_inverse],
        solar=None if credit.tisr.source is None else solar_source(credit.tisr, credit.timestep, data.root),
        geopotential=None if credit.geopotential.output is None else dict(credit.geopotential),
    )


def build_dataset(data: DictConfig, period_key: str) -> ERA5Dataset | CreditGen1Dataset | CreditGen2Dataset:
    """The dataset of `period_key`: training samples hold `data.forecast_len` target steps,
    validation samples (`valid_period`) `data.valid_forecast_len`."""
    forecast_len = data.valid_forecast_len if period_key == "valid_period" else data.forecast_len
    if data.layout == "credit-gen2":
        return credit_gen2_dataset(data, tuple(data[period_key]), forecast_len)
    if data.layout == "credit-gen1":
        return credit_gen1_dataset(data, tuple(data[period_key]), forecast_len)
    return ERA5Dataset(
        data.root,
        files=dict(data.files),
        variables=variable_spec(data),
        levels=list(data.levels),
        period=tuple(data[period_key]),
        history_len=data.history_len,
        forecast_len=forecast_len,
        normalize=data.normalize,
        level_dim=data.level_dim,
        nonfinite=data.nonfinite,
        allow_missing_times=data.allow_missing_times,
    )


def model_layout(data: DictConfig,
                 dataset: ERA5Dataset | CreditGen1Dataset | CreditGen2Dataset | None = None) -> dict[str, Any]:
    """The data layout `build_model` needs (channel counts, history, grid): the variables and
    levels of `data.*` on the grid of `dataset` (default: the training dataset of `data`)."""
    if dataset is None:
        dataset = build_dataset(data, "train_period")
    frames = data.history_len
    if data.layout == "credit-gen1":
        frames = dataset.input_frames  # history_len counts file steps, skip_periods apart
    return layout_from_counts(**_variable_counts(data), history_len=frames, grid=tuple(dataset.grid_shape))


def _variable_counts(data: DictConfig) -> dict[str, int]:
    v = data.variables
    forcing = len(v.forcing)
    if data.layout == "credit-gen1":  # CREDIT's forcing block: dynamic forcing, forcing file
        forcing += len(data.credit.forcing_file_variables)
    return dict(upper_air=len(v.upper_air), levels=len(data.levels), surface=len(v.surface), forcing=forcing,
                static=len(v.static), diagnostic=len(v.diagnostic))


CHANNEL_KEYS = ("channels", "levels", "surface_channels", "input_only_channels", "output_only_channels")


def check_model_channels(data: DictConfig, model: DictConfig) -> None:
    """Before any file is read: a CREDIT model's channel counts that `model.*` sets must be
    those of the data's variable lists (ConfigError naming the key), the check `build_model`
    makes with the files' grid and frames (`credit.interop.command_line.channel_mismatch`:
    a CREDIT file whose model section disagrees with its own variable lists is refused by
    `credit check`, not at the first step)."""
    from credit.config import ConfigError
    from credit.models.build import CREDIT_TYPES, credit_arguments  # the model code: only for CREDIT's models

    if model.name not in CREDIT_TYPES:
        return
    counts = layout_from_counts(**_variable_counts(data), history_len=data.history_len, grid=(0, 0))
    channels = {key: counts["credit_channels"][key] for key in CHANNEL_KEYS}
    if not len(data.levels):  # the files' levels, read later
        del channels["levels"]
    try:
        credit_arguments(model, channels)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def layout_from_counts(*, upper_air: int, levels: int, surface: int, forcing: int, static: int,
                       diagnostic: int, history_len: int, grid: tuple[int, int]) -> dict[str, Any]:
    """`model_layout` from variable counts: the layout of a sample whose state holds
    `upper_air` x `levels` + `surface` channels per input time (`credit.data.dataset`),
    also for `credit plan`, which reads no data."""
    levels = levels if upper_air else 0
    state = upper_air * levels + surface
    return dict(
        in_channels=state * history_len + forcing + static,
        out_channels=state + diagnostic,
        state_channels=state,
        history_len=history_len,
        grid=tuple(grid),
        # CREDIT's channel counts (credit.models.inputs documents the order)
        credit_channels=dict(
            channels=upper_air,
            levels=levels,
            surface_channels=surface,
            input_only_channels=forcing + static,
            output_only_channels=diagnostic,
            frames=history_len,
            image_height=grid[0],
            image_width=grid[1],
        ),
    )
