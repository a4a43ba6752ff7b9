"""Build the model exactly as training does (same mesh, same parallelisation) and load a
checkpoint's model or EMA weights into it, strictly.

Weights are loaded through DCP into the possibly sharded model, so a checkpoint saved under
any dp x tp layout loads under any other; the optimizer state is never read.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from omegaconf import DictConfig
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from credit.checkpoint.manager import load_checkpoint
from credit.data import ERA5Dataset
from credit.models import build_model
from credit.parallel import parallelize_model, seed_for_init
from credit.rollout.errors import RolloutError
from credit.train.runtime import Runtime

log = logging.getLogger(__name__)


def build_forecast_model(cfg: DictConfig, dataset: ERA5Dataset, runtime: Runtime) -> nn.Module:
    """The model of `cfg.model` for `dataset`'s channel layout, parallelised over the runtime's
    mesh like training (`trainer.parallelism`); weights still at their initial values."""
    seed_for_init(cfg.trainer.seed)
    sample = dataset[0]
    model = build_model(
        cfg.model,
        in_channels=sample["state"].shape[0] * sample["state"].shape[1]
        + sample["forcing"].shape[1] + sample["static"].shape[0],
        out_channels=sample["target"].shape[1],
        state_channels=len(dataset.state_channel_names),
        history_len=cfg.data.history_len,
        grid=tuple(dataset.grid_shape),
    ).to(runtime.device)
    if runtime.mesh is not None:
        par = cfg.trainer.parallelism
        parallelize_model(model, runtime.mesh, par.data, mixed_precision=par.mixed_precision)
    return model


def _listed(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def _check_keys(path: Path, prefix: str, expected: dict[str, torch.Size]) -> None:
    """Every expected `prefix.name` is stored with the same shape, and nothing else is."""
    stored = {k[len(prefix) + 1:]: md for k, md in
              dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata.items()
              if k.startswith(prefix + ".")}
    problems = []
    missing = sorted(set(expected) - set(stored))
    unexpected = sorted(set(stored) - set(expected))
    if missing:
        problems.append(f"missing {_listed([f'{prefix}.{k}' for k in missing])}")
    if unexpected:
        problems.append(f"unexpected {_listed([f'{prefix}.{k}' for k in unexpected])}")
    shapes = [f"{prefix}.{k} stored {tuple(md.size)}, model {tuple(expected[k])}"
              for k, md in sorted(stored.items()) if k in expected
              and isinstance(md, TensorStorageMetadata) and tuple(md.size) != tuple(expected[k])]
    if shapes:
        problems.append(f"shape mismatch {_listed(shapes, 2)}")
    if problems:
        raise RolloutError(f"checkpoint {path} does not fit the model: " + "; ".join(problems))


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


@torch.no_grad()
def load_weights(model: nn.Module, path: Path, weights: str) -> None:
    """Load `path`'s model weights (and, for weights="ema", its EMA averages over the
    parameters) into `model`; a missing, unexpected or reshaped key is a RolloutError."""
    model_state = get_model_state_dict(model)
    _check_keys(path, "model", {k: v.shape for k, v in model_state.items()})
    state = {"model": model_state}
    if weights == "ema":
        # Same names and placements as the trainer's EMA shadow, so DCP reshards it alike.
        state["ema"] = {name: p.detach().clone() for name, p in model.named_parameters()}
        _check_keys(path, "ema", {k: v.shape for k, v in state["ema"].items()})
    load_checkpoint(path, state)
    set_model_state_dict(model, state["model"])
    if weights == "ema":
        for name, param in model.named_parameters():
            param.copy_(state["ema"][name])
    log.info("loaded %s weights from %s", weights, path)
