"""Turn the `model.*` config and the data layout into a constructed model."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from omegaconf import DictConfig, OmegaConf
from torch import nn

from credit.config.validate import ConfigError
from credit.models.credit.config import TYPES as CREDIT_TYPES
from credit.models.credit.config import build_credit_model, resolve_credit_model
from credit.models.credit.postblocks import PostBlockConfigError, run_post_blocks
from credit.models.layer_kit import mark_whole_reductions
from credit.models.spectral_norm import apply_spectral_norm
from credit.models.windowformer.model import WindowFormer, WindowFormerSpec

log = logging.getLogger(__name__)

# Keys of `model.*` that are not WindowFormerSpec fields but are consumed here.
_BUILD_KEYS = {"name", "use_spectral_norm", "spectral_norm_tp"}  # the last: for parallelize_model
# WindowFormerSpec fields that come from the data layout, not from `model.*`.
_LAYOUT_FIELDS = {"in_channels", "out_channels", "state_channels", "history_len", "grid"}
# `model.*` keys of CREDIT's models that are not CREDIT's constructor's: this project's, and
# `post_conf`, which `attach_post_blocks` builds from the data
_OWN_CREDIT_KEYS = {"name", "gemm", "spectral_norm_tp", "post_conf"}
MODEL_NAMES = ("windowformer", *CREDIT_TYPES)
# where each CREDIT count comes from in the data config, for the mismatch error
_DATA_SOURCE = {
    "channels": "data.variables.upper_air", "levels": "data.levels", "surface_channels": "data.variables.surface",
    "input_only_channels": "data.variables.forcing + data.variables.static",
    "output_only_channels": "data.variables.diagnostic", "frames": "data.history_len",
    "image_height": "the data's grid", "image_width": "the data's grid",
}


def model_spec(model_cfg: Mapping[str, Any], **layout: Any) -> WindowFormerSpec:
    """Build the windowformer's spec; an unknown `model.*` key is an error naming it."""
    spec_keys = {f.name for f in fields(WindowFormerSpec)} - _LAYOUT_FIELDS
    unknown = sorted(set(model_cfg) - spec_keys - _BUILD_KEYS)
    if unknown:
        raise ValueError(
            f"unknown model key(s) {['model.' + k for k in unknown]}; allowed: "
            f"{sorted(spec_keys | _BUILD_KEYS)}"
        )
    values: dict[str, Any] = {}
    for key in spec_keys:
        if key not in model_cfg:
            continue
        value = model_cfg[key]
        if key == "cross_embed_kernel_sizes":
            value = tuple(tuple(int(k) for k in ks) for ks in value)
        elif isinstance(value, (list, tuple)) or hasattr(value, "__iter__") and not isinstance(value, str):
            value = tuple(value)
        values[key] = value
    return WindowFormerSpec(**values, **{k: layout[k] for k in _LAYOUT_FIELDS})


def credit_arguments(model_cfg: Mapping[str, Any], credit_channels: Mapping[str, int]) -> dict[str, Any]:
    """CREDIT's constructor arguments from `model.*`: grid and channel keys left null are
    taken from the data; set ones must equal the data's (ValueError naming both)."""
    if isinstance(model_cfg, DictConfig):
        model_cfg = OmegaConf.to_container(model_cfg, resolve=True)
    values = {k: v for k, v in model_cfg.items() if k not in _OWN_CREDIT_KEYS}
    for key, from_data in credit_channels.items():
        if values.get(key) is None:
            values[key] = from_data
        elif int(values[key]) != from_data:
            raise ValueError(
                f"model.{key}={values[key]} does not match the data: {_DATA_SOURCE[key]} gives "
                f"{from_data}; set model.{key}={from_data} or null (from the data), or use data of "
                f"the checkpoint's layout"
            )
    return {"type": model_cfg["name"], **values}


def build_model(model_cfg: Mapping[str, Any], **layout: Any) -> nn.Module:
    """Construct the model named by `model.name` for the given data layout.

    `layout` is `credit.data.model_layout`'s: in_channels, out_channels, state_channels,
    history_len, grid, and CREDIT's channel counts.
    """
    name = model_cfg.get("name", "windowformer")
    if name not in MODEL_NAMES:
        raise ValueError(f"model.name={name!r} is not one of {list(MODEL_NAMES)}")
    if name in CREDIT_TYPES:
        try:
            kind, values = resolve_credit_model(credit_arguments(model_cfg, layout["credit_channels"]))
            model = build_credit_model(kind, values, model_cfg.get("gemm", "fast"))
        except ValueError as error:  # a model key that does not fit the data's grid or channels
            raise ConfigError(str(error)) from None
    else:
        spec = model_spec(model_cfg, **layout)
        model = WindowFormer(spec)
        if model_cfg.get("use_spectral_norm", False):
            apply_spectral_norm(model, deterministic=spec.gemm == "deterministic")
    mark_whole_reductions(model)
    return model


def attach_post_blocks(model: nn.Module, model_cfg: Mapping[str, Any], data_cfg: Mapping[str, Any],
                       dataset: Any) -> nn.Module:
    """Give a CREDIT CrossFormer the post blocks of an active `model.post_conf`, on the output
    channels of `data.*` and the statistics and time step of `dataset`; before any
    parallelisation (they hold no parameters). One ConfigError naming the key otherwise."""
    post_conf = model_cfg.get("post_conf")
    if not post_conf or not post_conf.get("activate", False):
        return model
    try:
        blocks = run_post_blocks(model_cfg, data_cfg, dataset)
    except PostBlockConfigError as error:
        raise ConfigError(str(error)) from None
    for where, fixers in (("inside the model's forward", blocks.inside), ("after the model", blocks.outside)):
        if fixers is not None:
            log.info("CREDIT's post blocks %s: %s", where, ", ".join(f.key for f in fixers.fixers))
    return blocks.attach(model)
