"""Whether a checkpoint was written by the model this run builds: one home for the rule.

A run rebuilds its model from its own config, so the keys that shape the model must equal
those stored in the checkpoint's `config`: `model.*` (except the keys below, which change
the arithmetic or the regularisation, not the parameters) and the data keys that fix the
model's channel layout. Everything else may change on resume: data paths and periods,
`trainer.*` (max_steps, batch size, optimizer and schedule hyperparameters, which the
config then sets, logging, checkpointing), the parallel layout, diagnostics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from credit.checkpoint.manager import CheckpointError, checkpoint_keys, checkpoint_problem, load_checkpoint

# Keys outside `model.*` that fix the model's channel layout.
LAYOUT_KEYS = ("data.variables", "data.levels", "data.history_len")
# `model.*` keys (and sections) that may differ from the checkpoint's: same parameters, other
# arithmetic (gemm), regularisation (dropouts), tensor-parallel placement (spectral_norm_tp)
# or post-processing of the forecast (post_conf: CREDIT's post blocks hold no parameters,
# and checkpoints written before it existed lack it).
MUTABLE_MODEL_KEYS = ("model.attn_dropout", "model.ff_dropout", "model.gemm", "model.spectral_norm_tp",
                      "model.post_conf")


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
    """`key: run X, checkpoint Y` for every model-shaping key that differs. A section the
    stored config lacks altogether (e.g. a converted checkpoint's) is not compared; the
    strict weight loading still checks every key and shape."""
    differences = []
    for dotted in ("model", *LAYOUT_KEYS):
        if _section(stored, dotted) is None:
            continue
        ours, theirs = _flatten(_section(run, dotted), dotted), _flatten(_section(stored, dotted), dotted)
        for key in sorted(set(ours) | set(theirs)):
            if any(key == m or key.startswith(m + ".") for m in MUTABLE_MODEL_KEYS):
                continue
            a, b = ours.get(key, "<absent>"), theirs.get(key, "<absent>")
            if a != b:
                differences.append(f"{key}: run {a}, checkpoint {b}")
    return differences


def check_resume_config(run: DictConfig, path: Path) -> None:
    """Raise CheckpointError naming every model-shaping key where `run` differs from the
    config stored in checkpoint directory `path` (nothing to compare: a single file, or a
    checkpoint without a config), or what is wrong with a damaged directory."""
    path = Path(path)
    if not path.is_dir():
        return
    problem = checkpoint_problem(path)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path} is not a complete DCP checkpoint directory: {problem}")
    stored = stored_config(path)
    if stored is None:
        return
    differences = model_config_differences(run, stored)
    if differences:
        raise CheckpointError(
            f"cannot resume from {path}: the model differs from the checkpoint's: "
            + "; ".join(differences)
            + f". These must match the checkpoint (model.* except {', '.join(MUTABLE_MODEL_KEYS)}; "
            f"{', '.join(LAYOUT_KEYS)}); data paths and periods, trainer.* and the parallel "
            f"layout may change")
