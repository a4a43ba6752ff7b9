"""The forecast model, built exactly as training builds it (same mesh, same parallelisation),
and the choice between a checkpoint's model and EMA weights.

Weights are loaded by `credit.checkpoint.resume.load_forecast_weights` through DCP into the
possibly sharded model, so a checkpoint saved under any dp x tp layout loads under any other.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from torch import nn

from credit.data import ERA5Dataset, model_layout
from credit.models import attach_post_blocks, build_model
from credit.parallel import Runtime, parallelize_model, seed_for_init
from credit.rollout.errors import RolloutError


def build_forecast_model(cfg: DictConfig, dataset: ERA5Dataset, runtime: Runtime) -> nn.Module:
    """The model of `cfg.model` for `dataset`'s channel layout, parallelised over the runtime's
    mesh like training (`trainer.parallelism`); weights still at their initial values."""
    seed_for_init(cfg.trainer.seed)
    model = build_model(cfg.model, **model_layout(cfg.data, dataset))
    model = attach_post_blocks(model, cfg.model, cfg.data, dataset).to(runtime.device)
    if runtime.mesh is not None:
        par = cfg.trainer.parallelism
        parallelize_model(model, runtime.mesh, par.data, mixed_precision=par.mixed_precision,
                          spectral_norm_tp=cfg.model.spectral_norm_tp, sequence_parallel=par.sequence_parallel)
    return model


def has_ema(stored_keys: set[str]) -> bool:
    return any(k.startswith("ema.") for k in stored_keys)


def choose_weights(choice: str, stored_keys: set[str], path: Path) -> str:
    """`ema` or `model`: rollout.weights=auto takes EMA weights whenever they are stored."""
    if choice == "ema" and not has_ema(stored_keys):
        raise RolloutError(f"rollout.weights=ema but checkpoint {path} holds no EMA weights; "
                           f"use rollout.weights=auto or model")
    if choice == "auto":
        return "ema" if has_ema(stored_keys) else "model"
    return choice
