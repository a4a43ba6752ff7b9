"""The config-to-data adapter shared by training, rollout and checkpoint conversion:
`data.*` -> datasets (generating the embedded one on first use) -> the data layout the
model is built for."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch.distributed as dist
from omegaconf import DictConfig

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


def build_dataset(data: DictConfig, period_key: str) -> ERA5Dataset:
    return ERA5Dataset(
        data.root,
        files=dict(data.files),
        variables=variable_spec(data),
        levels=list(data.levels),
        period=tuple(data[period_key]),
        history_len=data.history_len,
        forecast_len=data.forecast_len,
        normalize=data.normalize,
        level_dim=data.level_dim,
        nonfinite=data.nonfinite,
        allow_missing_times=data.allow_missing_times,
    )


def model_layout(data: DictConfig, dataset: ERA5Dataset | None = None) -> dict[str, Any]:
    """The data layout `build_model` needs (channel counts, history, grid), read from one
    sample of `dataset` (default: the training dataset of `data`)."""
    if dataset is None:
        dataset = build_dataset(data, "train_period")
    sample = dataset[0]
    return dict(
        in_channels=sample["state"].shape[0] * sample["state"].shape[1]
        + sample["forcing"].shape[1]
        + sample["static"].shape[0],
        out_channels=sample["target"].shape[1],
        state_channels=len(dataset.state_channel_names),
        history_len=data.history_len,
        grid=tuple(dataset.grid_shape),
        # CREDIT's channel counts (credit.models.inputs documents the order)
        credit_channels=dict(
            channels=len(dataset.variables.upper_air),
            levels=len(dataset.levels) if dataset.variables.upper_air else 0,
            surface_channels=len(dataset.variables.surface),
            input_only_channels=len(dataset.variables.forcing) + len(dataset.variables.static),
            output_only_channels=len(dataset.variables.diagnostic),
            frames=data.history_len,
            image_height=dataset.grid_shape[0],
            image_width=dataset.grid_shape[1],
        ),
    )
