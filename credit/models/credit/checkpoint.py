"""Read a checkpoint written by CREDIT and load it into this project's model.

CREDIT's trainer saves `{"epoch", "model_state_dict", "optimizer_state_dict", ...}`; a
bare state dict, a DDP `module.` prefix and FSDP's `_fsdp_wrapped_module.` /
`_checkpoint_wrapped_module.` prefixes are accepted too. The weights go through
`remap_conv_state_dict` (older convolutional layout -> Linear, `weight_orig` -> `weight`)
and load strictly: a missing or unexpected key, or a shape that differs, is an error
naming the keys. `cube_embedding.*` (CREDIT's two CrossFormers build it, and at patch size 1
never uses it) is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import nn

from credit.models.credit.config import POST_BLOCK_TYPES, build_credit_model, resolve_credit_model
from credit.models.credit.remap import remap_conv_state_dict
from credit.models.credit.postblocks import build_post_blocks

# path components that DDP, torch.compile, FSDP1 and activation checkpointing insert
_WRAPPERS = {"module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}
_UNUSED_PREFIXES = ("cube_embedding.",)
log = logging.getLogger(__name__)


class CreditCheckpointError(ValueError):
    """A CREDIT checkpoint or config that cannot be loaded; the message names the file."""


def read_credit_config(source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """A whole CREDIT config: a path to its YAML, or the dict."""
    if isinstance(source, Mapping):
        return dict(source)
    try:
        data = OmegaConf.to_container(OmegaConf.load(Path(source)), resolve=False)
    except Exception as exc:  # OSError, or omegaconf's/yaml's parse errors
        reason = " ".join(str(exc).split())  # a YAML error spans lines: one line, as every error here
        raise CreditCheckpointError(f"{source}: cannot read the CREDIT config ({reason})") from None
    if not isinstance(data, Mapping):
        raise CreditCheckpointError(f"{source}: a CREDIT config is a mapping with a model: section")
    return dict(data)


def read_credit_model_section(source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """The `model:` section of a CREDIT config (a path to its YAML, or the dict; a dict
    without `model:` is taken as the section itself)."""
    where = "the given config" if isinstance(source, Mapping) else str(source)
    data = read_credit_config(source)
    section = data.get("model", data)
    if not isinstance(section, Mapping) or "type" not in section:
        raise CreditCheckpointError(f"{where}: no model: section with a type (crossformer, wxformer, wxformer_base "
                                    f"or nextgen_wxformer)")
    return dict(section)


def read_credit_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A CREDIT checkpoint file: its container (`{}` for a bare state dict) and every model
    entry in the saved order, wrapper prefixes removed (`cube_embedding.*` kept)."""
    try:
        # weights_only: tensors, numbers, strings and containers (CREDIT's container holds no more)
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged or foreign file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CreditCheckpointError(f"{path}: not a readable torch checkpoint with weights_only=True "
                                    f"({type(exc).__name__}: {first})") from None
    container: dict[str, Any] = {}
    if isinstance(blob, Mapping) and "model_state_dict" in blob:
        container, blob = dict(blob), blob["model_state_dict"]
    elif isinstance(blob, Mapping) and isinstance(blob.get("model"), Mapping):
        container, blob = dict(blob), blob["model"]
    if not isinstance(blob, Mapping) or not all(isinstance(v, torch.Tensor) for v in blob.values()):
        raise CreditCheckpointError(f"{path}: holds neither CREDIT's checkpoint container "
                                    f"(model_state_dict) nor a state dict of tensors")
    return container, {unwrapped_name(key): tensor for key, tensor in blob.items()}


def unwrapped_name(key: str) -> str:
    """`key` without the path components that DDP, compile, FSDP1 and checkpointing insert."""
    return ".".join(part for part in key.split(".") if part not in _WRAPPERS)


def is_unused_credit_key(key: str) -> bool:
    """An entry CREDIT's CrossFormers build and never use at patch size 1: not loaded here."""
    return key.startswith(_UNUSED_PREFIXES)


def read_credit_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The model weights of a CREDIT checkpoint file, wrapper prefixes removed."""
    _, state = read_credit_checkpoint(path)
    return {key: tensor for key, tensor in state.items() if not is_unused_credit_key(key)}


def may_start_fresh(model: nn.Module, missing: list[str], where: str) -> bool:
    """Whether every key `missing` from the checkpoint `where` is one the model may start
    without: `crossformer-ensemble`'s noise layers, which a deterministic CrossFormer's
    checkpoint lacks (CREDIT loads it strict=False). Warns once when so."""
    fresh = tuple(getattr(model, "fresh_weight_prefixes", ()))
    if not (fresh and missing and all(key.startswith(fresh) for key in missing)):
        return False
    log.warning("%s holds no weights of the model's noise layers (a deterministic CrossFormer's checkpoint): "
                "its %d noise weights start from their initialisation, as CREDIT loads it", where, len(missing))
    return True


def load_credit_weights(model: nn.Module, state: Mapping[str, torch.Tensor], where: str) -> None:
    """Remap and load strictly; one error naming what differs. The one exception is CREDIT's:
    a deterministic CrossFormer's checkpoint into `crossformer-ensemble` (CREDIT loads with
    strict=False and warns of the missing keys), whose noise layers then start fresh."""
    state = remap_conv_state_dict(state)
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    if may_start_fresh(model, missing, where):
        state = {**state, **{key: own[key] for key in missing}}
        missing = []
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    if missing or unexpected or shapes:
        problems = []
        if missing:
            problems.append(f"{len(missing)} missing (e.g. {missing[:3]})")
        if unexpected:
            problems.append(f"{len(unexpected)} unexpected (e.g. {unexpected[:3]})")
        if shapes:
            k = shapes[0]
            problems.append(f"{len(shapes)} of another shape (e.g. {k}: checkpoint "
                            f"{tuple(state[k].shape)}, model {tuple(own[k].shape)})")
        raise CreditCheckpointError(f"{where}: the weights do not fit the model the config describes: "
                                    + "; ".join(problems) + " -- is this the config the checkpoint was trained with?")
    model.load_state_dict(state)


def from_credit(credit_config: str | Path | Mapping[str, Any], checkpoint: str | Path) -> nn.Module:
    """CREDIT's model as its config describes it, with the checkpoint's weights, in eval
    mode. It takes and returns CREDIT's layout: (B, C, T, H, W) -> (B, C_out, 1, H, W).

    An active `model.post_conf` gives the model CREDIT's post blocks
    (`credit.models.credit.postblocks`), built from the config's `data:` section (a path to the
    whole CREDIT config), whose relative paths are looked for beside the config file, then
    in the working directory. As in CREDIT, the fixers inside the model run in its forward;
    those with `activate_outside_model` are the model's `outside_post_blocks`, which
    `credit.models.inputs.predict` (training, rollout) runs after it."""
    section = read_credit_model_section(credit_config)
    kind, values = resolve_credit_model(section)
    model = build_credit_model(kind, values)
    load_credit_weights(model, read_credit_state_dict(checkpoint), str(checkpoint))
    if kind in POST_BLOCK_TYPES and isinstance(section.get("post_conf"), Mapping) \
            and section["post_conf"].get("activate", False):
        config = read_credit_config(credit_config)
        if "model" not in config:
            config = {"model": section}
        where = Path(credit_config).parent if not isinstance(credit_config, Mapping) else Path.cwd()
        build_post_blocks(config, where).attach(model)
    return model.eval()
