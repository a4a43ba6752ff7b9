"""Whether a rollout's checkpoint was trained with this run's model.

The model is rebuilt from the run's config, so `model.*` and the keys that shape the model's
input and output (variables, levels, history length) must equal those stored in the
checkpoint's `config`; a difference is one error naming every differing key.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from credit.checkpoint.manager import checkpoint_keys, load_checkpoint
from credit.rollout.errors import RolloutError

log = logging.getLogger(__name__)

# Keys outside `model.*` that fix the model's channel layout.
LAYOUT_KEYS = ("data.variables", "data.levels", "data.history_len")


def stored_config(path: Path) -> DictConfig | None:
    """The resolved config saved with the checkpoint, or None when it holds none."""
    if "config" not in checkpoint_keys(path):
        return None
    state: dict[str, Any] = {"config": ""}
    load_checkpoint(path, state)
    return OmegaConf.create(state["config"]) if state["config"] else None


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}"))
        return out
    return {prefix: value}


def _section(cfg: DictConfig, dotted: str) -> Any:
    node = OmegaConf.select(cfg, dotted, default=None)
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def model_config_differences(run: DictConfig, stored: DictConfig) -> list[str]:
    """`key: run X, checkpoint Y` for every key of `model.*` and LAYOUT_KEYS that differs.
    A section the stored config lacks altogether (e.g. a converted checkpoint's) is not
    compared; the strict weight loading still checks every key and shape."""
    differences = []
    for dotted in ("model", *LAYOUT_KEYS):
        if _section(stored, dotted) is None:
            continue
        ours, theirs = _flatten(_section(run, dotted), dotted), _flatten(_section(stored, dotted), dotted)
        for key in sorted(set(ours) | set(theirs)):
            a, b = ours.get(key, "<absent>"), theirs.get(key, "<absent>")
            if a != b:
                differences.append(f"{key}: run {a}, checkpoint {b}")
    return differences


def check_model_config(cfg: DictConfig, path: Path) -> None:
    """Raise RolloutError when the run's model config differs from the checkpoint's."""
    stored = stored_config(path)
    if stored is None:
        log.warning("checkpoint %s stores no config; the model is checked by its weights only", path)
        return
    differences = model_config_differences(cfg, stored)
    if differences:
        raise RolloutError(
            f"the model config differs from checkpoint {path}: " + "; ".join(differences)
            + " (pass the training run's model/data overrides)")
