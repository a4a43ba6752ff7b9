"""Turn the `model.*` config and the data layout into a constructed model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from torch import nn

from credit.models.spectral_norm import apply_spectral_norm
from credit.models.wxformer import WXFormer, WXFormerSpec

# Keys of `model.*` that are not WXFormerSpec fields but are consumed here.
_BUILD_KEYS = {"name", "use_spectral_norm", "spectral_norm_tp"}  # the last: for parallelize_model
# WXFormerSpec fields that come from the data layout, not from `model.*`.
_LAYOUT_FIELDS = {"in_channels", "out_channels", "state_channels", "history_len", "grid"}
MODEL_NAMES = ("wxformer",)


def model_spec(model_cfg: Mapping[str, Any], **layout: Any) -> WXFormerSpec:
    """Build the model spec; an unknown `model.*` key is an error naming it."""
    spec_keys = {f.name for f in fields(WXFormerSpec)} - _LAYOUT_FIELDS
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
    return WXFormerSpec(**values, **layout)


def build_model(model_cfg: Mapping[str, Any], **layout: Any) -> nn.Module:
    """Construct the model named by `model.name` for the given data layout.

    `layout` gives in_channels, out_channels, state_channels, history_len and grid.
    """
    name = model_cfg.get("name", "wxformer")
    if name not in MODEL_NAMES:
        raise ValueError(f"model.name={name!r} is not one of {list(MODEL_NAMES)}")
    spec = model_spec(model_cfg, **layout)
    model = WXFormer(spec)
    if model_cfg.get("use_spectral_norm", False):
        apply_spectral_norm(model, deterministic=spec.gemm == "deterministic")
    return model
