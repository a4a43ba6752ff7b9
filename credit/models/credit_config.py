"""A CREDIT `model:` section -> one of CREDIT's architectures, built here.

The keys are CREDIT's constructor arguments with CREDIT's meanings and, where a key is
absent, CREDIT's defaults. A key this project does not implement in an active form
(post-processing blocks, patch sizes > 1, diffusion, several output frames, decoder
attention types) is refused with one line naming it; a key CREDIT's own class accepts
and ignores is reported once as a warning; any other key is an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from credit.models.credit_padding import BoundaryPadding
from credit.models.crossformer import CreditSpec, CrossFormer
from credit.models.spectral_norm import apply_spectral_norm
from credit.models.wxformer_next import WXFormerNext

log = logging.getLogger(__name__)

TYPES = ("crossformer", "wxformer_next")

# CREDIT's constructor defaults (miles-credit 5e14b83c), per architecture.
_SHARED = dict(
    image_height=640, image_width=1280, frames=2, channels=4, surface_channels=7, input_only_channels=3,
    output_only_channels=0, levels=15, dim=(64, 128, 256, 512), depth=(2, 2, 8, 2), dim_head=32,
    global_window_size=(5, 5, 2, 1), local_window_size=10,
    cross_embed_kernel_sizes=((4, 8, 16, 32), (2, 4), (2, 4), (2, 4)), cross_embed_strides=(4, 2, 2, 2),
    attn_dropout=0.0, ff_dropout=0.0, use_spectral_norm=True,
)
DEFAULTS: dict[str, dict[str, Any]] = {
    "crossformer": {**_SHARED, "interp": True, "padding_conf": None},
    "wxformer_next": {**_SHARED, "col_attn_heads": 4, "col_attn_stride": 1, "decoder_col_attn": False,
                      "num_spectral_nodes": 64},
}
# CREDIT keys whose only supported value is the inactive one: key -> (is it active?, allowed)
_INACTIVE_ONLY: dict[str, tuple[Callable[[Any], bool], str]] = {
    "post_conf": (lambda v: bool(v) and bool(dict(v).get("activate", False)), "absent or activate: false"),
    "patch_height": (lambda v: int(v) != 1, "1"),
    "patch_width": (lambda v: int(v) != 1, "1"),
    "output_frames": (lambda v: int(v) != 1, "1"),
    "diffusion": (lambda v: bool(v), "false"),
    "attention_type": (lambda v: v not in (None, "none", "None"), "null"),
}
# keys CREDIT's class accepts and does nothing with
_IGNORED_BY_CREDIT = {
    "crossformer": {"upsample_with_ps"},
    "wxformer_next": {"upsample_with_ps", "interp", "padding_conf"},
}


def _tuple4(key: str, value: Any) -> tuple:
    values = (value,) * 4 if isinstance(value, (int, float)) else tuple(value)
    if len(values) != 4:
        raise ValueError(f"model.{key}={list(values)} must have 4 entries, one per encoder stage")
    return values


def credit_spec(values: Mapping[str, Any]) -> CreditSpec:
    """The shared architecture arguments, normalised (scalars broadcast to 4 stages)."""
    kernels = values["cross_embed_kernel_sizes"]
    if kernels and isinstance(kernels[0], int):  # one kernel set for every stage
        kernels = [kernels] * 4
    return CreditSpec(
        image_height=int(values["image_height"]), image_width=int(values["image_width"]),
        frames=int(values["frames"]), channels=int(values["channels"]), levels=int(values["levels"]),
        surface_channels=int(values["surface_channels"]),
        input_only_channels=int(values["input_only_channels"]),
        output_only_channels=int(values["output_only_channels"]),
        dim=tuple(int(d) for d in _tuple4("dim", values["dim"])),
        depth=tuple(int(d) for d in _tuple4("depth", values["depth"])),
        dim_head=int(values["dim_head"]),
        global_window_size=tuple(int(w) for w in _tuple4("global_window_size", values["global_window_size"])),
        local_window_size=tuple(int(w) for w in _tuple4("local_window_size", values["local_window_size"])),
        cross_embed_kernel_sizes=tuple(tuple(int(k) for k in ks)
                                       for ks in _tuple4("cross_embed_kernel_sizes", kernels)),
        cross_embed_strides=tuple(int(s) for s in _tuple4("cross_embed_strides", values["cross_embed_strides"])),
        attn_dropout=float(values["attn_dropout"]), ff_dropout=float(values["ff_dropout"]),
        use_spectral_norm=bool(values["use_spectral_norm"]),
    )


def resolve_credit_model(section: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(type, every argument with CREDIT's defaults filled in) of a CREDIT `model:` section.

    Raises ValueError naming the key for an unknown type, an unknown key, or a feature
    this project does not implement; warns for keys CREDIT itself ignores.
    """
    section = dict(section)
    kind = section.pop("type", None)
    if kind not in TYPES:
        raise ValueError(f"model.type={kind!r} is not one of {list(TYPES)}")
    for key, (active, allowed) in _INACTIVE_ONLY.items():
        if key in section:
            if active(section[key]):
                raise ValueError(f"model.{key}={section.pop(key)!r} is not supported by credit's {kind}; "
                                 f"allowed: {allowed}")
            section.pop(key)
    ignored = sorted(k for k in section if k in _IGNORED_BY_CREDIT[kind])
    if ignored:
        log.warning("CREDIT's %s ignores %s; so does credit", kind, ", ".join(f"model.{k}" for k in ignored))
        for key in ignored:
            section.pop(key)
    unknown = sorted(set(section) - set(DEFAULTS[kind]))
    if unknown:
        raise ValueError(f"unknown key(s) {['model.' + k for k in unknown]} for model.type={kind}; "
                         f"allowed: {sorted(DEFAULTS[kind])}")
    return kind, {**DEFAULTS[kind], **section}


def padding_from_conf(conf: Mapping[str, Any] | None) -> BoundaryPadding | None:
    """CREDIT's `padding_conf` (activate, mode, pad_lat, pad_lon) as a BoundaryPadding."""
    if not conf or not conf.get("activate", False):
        return None
    unknown = sorted(set(conf) - {"activate", "mode", "pad_lat", "pad_lon"})
    if unknown:
        raise ValueError(f"unknown key(s) {['model.padding_conf.' + k for k in unknown]}; allowed: "
                         f"activate, mode, pad_lat, pad_lon")
    return BoundaryPadding(conf.get("mode", "earth"), tuple(conf.get("pad_lat", (40, 40))),
                           tuple(conf.get("pad_lon", (40, 40))))


def build_credit_model(kind: str, values: Mapping[str, Any], gemm: str = "fast") -> nn.Module:
    """One of CREDIT's architectures from resolved arguments (`resolve_credit_model`),
    spectral-normalised where CREDIT normalises; `gemm` is `model.gemm` (fast | deterministic)."""
    spec = credit_spec(values)
    if kind == "crossformer":
        model = CrossFormer(spec, interp=bool(values["interp"]), padding=padding_from_conf(values["padding_conf"]),
                            gemm=gemm)
        normalised = [model]
    else:
        model = WXFormerNext(spec, col_attn_heads=int(values["col_attn_heads"]),
                             col_attn_stride=int(values["col_attn_stride"]),
                             decoder_col_attn=bool(values["decoder_col_attn"]),
                             num_spectral_nodes=int(values["num_spectral_nodes"]), gemm=gemm)
        # CREDIT leaves the level embedding (no layers) and the column attention unnormalised
        normalised = [model.layers, model.spectral_bottleneck, model.up_block1, model.up_block2,
                      model.up_block3, model.up_block4]
    if spec.use_spectral_norm:
        for part in normalised:
            apply_spectral_norm(part, deterministic=gemm == "deterministic")
    return model
