"""A CREDIT `model:` section -> one of CREDIT's architectures, built here.

`model.type` is read as CREDIT's model registry (`credit/models/__init__.py`) reads it:

| CREDIT type | CREDIT class | built here as |
| --- | --- | --- |
| `crossformer` | `credit.models.crossformer.CrossFormer` (the older CrossFormer) | `credit.models.credit.crossformer.CrossFormer` |
| `wxformer`, `wxformer_base` | `credit.models.wxformer.crossformer.CrossFormer` | `credit.models.credit.wxformer.WXFormer` |
| `nextgen_wxformer` | `credit.models.wxformer.wxformer_next.NextGenWXFormer` | `credit.models.credit.wxformer_next.WXFormerNext` |
| `crossformer-ensemble`, `crossformer-style` | `credit.models.wxformer.crossformer_ensemble.CrossFormerWithNoise` | `credit.models.credit.crossformer_ensemble.CrossFormerEnsemble` |

Any other type of CREDIT's registry is refused with one line naming it. The keys are
CREDIT's constructor arguments with CREDIT's meanings and, where a key is absent, CREDIT's
defaults. Each class takes further keys through `**kwargs` and does nothing with them: those
are ignored here too, with one warning naming them. A key CREDIT acts on that this project
does not implement (patch sizes > 1, diffusion, several output frames, a post block other
than the four fixers) is refused with one line naming it. `post_conf` becomes this
project's `model.post_conf` (`post_conf_overrides`), with `data.save_loc_physics` as
`data.physics_file`. This module is the one table of that mapping.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from credit.models.padding import BoundaryPadding
from credit.models.credit.crossformer import CrossFormer
from credit.models.credit.crossformer_ensemble import CrossFormerEnsemble
from credit.models.credit.postblocks.settings import (FIXERS, OTHER_MODULES, PostBlockConfigError, active_fixers,
                                               resolve_path)
from credit.models.spectral_norm import apply_spectral_norm
from credit.models.credit.wxformer import CreditSpec, WXFormer
from credit.models.credit.wxformer_next import WXFormerNext

log = logging.getLogger(__name__)

TYPES = ("crossformer", "wxformer", "nextgen_wxformer", "crossformer-ensemble")  # CREDIT's registry names
ALIASES = {"wxformer_base": "wxformer", "crossformer-style": "crossformer-ensemble"}  # one class each
CREDIT_CLASSES = {
    "crossformer": "credit.models.crossformer.CrossFormer",
    "wxformer": "credit.models.wxformer.crossformer.CrossFormer",
    "nextgen_wxformer": "credit.models.wxformer.wxformer_next.NextGenWXFormer",
    "crossformer-ensemble": "credit.models.wxformer.crossformer_ensemble.CrossFormerWithNoise",
}
# the rest of CREDIT's registry (miles-credit 5e14b83c): named in the refusal
OTHER_CREDIT_TYPES = ("camulator", "crossformer-diffusion", "crossformer_downscaling", "debugger", "dscale", "fuxi", "graph", "swin", "unet",
                      "unet-diffusion", "unet404", "unet_downscaling", "wrf")

# CREDIT's constructor defaults (miles-credit 5e14b83c), per architecture.
_SHARED = dict(
    image_height=640, image_width=1280, frames=2, channels=4, surface_channels=7, input_only_channels=3,
    output_only_channels=0, levels=15, dim=(64, 128, 256, 512), depth=(2, 2, 8, 2), dim_head=32,
    global_window_size=(5, 5, 2, 1), local_window_size=10,
    cross_embed_kernel_sizes=((4, 8, 16, 32), (2, 4), (2, 4), (2, 4)), cross_embed_strides=(4, 2, 2, 2),
    attn_dropout=0.0, ff_dropout=0.0, use_spectral_norm=True,
)
DEFAULTS: dict[str, dict[str, Any]] = {
    "crossformer": {**_SHARED, "interp": True, "padding_conf": None, "upsample_v_conv": False,
                    "attention_type": None},
    "wxformer": {**_SHARED, "interp": True, "padding_conf": None},
    "nextgen_wxformer": {**_SHARED, "col_attn_heads": 4, "col_attn_stride": 1, "decoder_col_attn": False,
                         "num_spectral_nodes": 64},
}
DEFAULTS["crossformer-ensemble"] = {**DEFAULTS["crossformer"], "noise_latent_dim": 128, "encoder_noise_factor": 0.05,
                                    "decoder_noise_factor": 0.275, "encoder_noise": True, "freeze": True,
                                    "correlated": False}
# keys the two CrossFormers act on, whose only supported value is the inactive one:
# key -> (is it active?, allowed). NextGenWXFormer reads none of them.
_INACTIVE_ONLY: dict[str, tuple[Callable[[Any], bool], str]] = {
    "patch_height": (lambda v: int(v) != 1, "1"),
    "patch_width": (lambda v: int(v) != 1, "1"),
    "output_frames": (lambda v: int(v) != 1, "1"),
    "diffusion": (lambda v: bool(v), "false"),
}
_ACTS_ON_INACTIVE = {"crossformer": set(_INACTIVE_ONLY), "wxformer": set(_INACTIVE_ONLY), "nextgen_wxformer": set(),
                     "crossformer-ensemble": set(_INACTIVE_ONLY)}
# the classes whose forward runs CREDIT's post blocks (NextGenWXFormer ignores `post_conf`)
POST_BLOCK_TYPES = ("crossformer", "wxformer", "crossformer-ensemble")
# the keys of each fixer's section this project reads (`credit.config.schema_model.PostConf`); the
# water and energy fixers take their grid from the mass fixer's section, as CREDIT's do
_CONSERVATION = ("activate", "activate_outside_model", "denorm", "specific_total_water_name", "surface_pressure_name")
POST_CONF_KEYS = {
    "tracer_fixer": ("activate", "denorm", "tracer_name", "tracer_thres", "tracer_thres_max"),
    "global_mass_fixer": (*_CONSERVATION, "grid_type", "midpoint", "fix_level_num", "lon_lat_level_name"),
    "global_water_fixer": (*_CONSERVATION, "precipitation_name", "evaporation_name"),
    "global_energy_fixer": (*_CONSERVATION, "air_temperature_name", "u_wind_name", "v_wind_name",
                            "surface_geopotential_name", "TOA_net_radiation_flux_name",
                            "surface_net_radiation_flux_name", "surface_energy_flux_name"),
}
_MASS_GRID = ("grid_type", "midpoint", "lon_lat_level_name")  # read by every conservation fixer


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


def credit_type(kind: Any) -> str:
    """This project's name for a CREDIT `model.type`; ValueError naming the type otherwise."""
    kind = ALIASES.get(kind, kind)
    if kind in TYPES:
        return kind
    what = "another of CREDIT's model types" if kind in OTHER_CREDIT_TYPES else "not a CREDIT model type"
    raise ValueError(f"model.type={kind!r} is {what} that credit does not build; supported: "
                     f"{sorted([*TYPES, *ALIASES])}")


def refused_keys(section: Mapping[str, Any]) -> list[str]:
    """One line per key of a CREDIT `model:` section that CREDIT acts on and this project
    does not implement (empty: the section can be built as CREDIT builds it)."""
    kind = credit_type(section.get("type"))
    lines = []
    for key in sorted(_ACTS_ON_INACTIVE[kind] & set(section)):
        active, allowed = _INACTIVE_ONLY[key]
        if active(section[key]):
            value = section[key]
            shown = f"{{activate: true, {', '.join(k for k in value if k != 'activate')}}}" \
                if isinstance(value, Mapping) else repr(value)
            lines.append(f"model.{key}={shown} is not supported by credit's {kind}; allowed: {allowed}")
    if kind in POST_BLOCK_TYPES and isinstance(section.get("post_conf"), Mapping):
        try:
            active_fixers(section["post_conf"])
        except PostBlockConfigError as error:
            lines.append(f"model.{error}")
    return lines


def resolve_credit_model(section: Mapping[str, Any], warn: bool = True,
                         refuse: bool = True) -> tuple[str, dict[str, Any]]:
    """(type, every argument with CREDIT's defaults filled in) of a CREDIT `model:` section.

    Raises ValueError naming the key for an unknown type or a feature this project does not
    implement (`refuse=False` sets such keys aside instead); warns once (unless `warn` is
    false) for the keys CREDIT's class ignores.
    """
    refused = refused_keys(section)
    if refused and refuse:
        raise ValueError(refused[0])
    ignored = ignored_keys(section)
    section = dict(section)
    kind = credit_type(section.pop("type", None))
    if "padding_conf" in DEFAULTS[kind]:
        section = _parser_padding(section)
    for key in _ACTS_ON_INACTIVE[kind] & set(section):
        section.pop(key)
    if kind in POST_BLOCK_TYPES:  # post blocks are built apart from the model (post_conf_overrides)
        section.pop("post_conf", None)
    if ignored and warn:
        log.warning("CREDIT's %s takes %s through **kwargs and ignores them; so does credit",
                    CREDIT_CLASSES[kind], ", ".join(f"model.{k}" for k in ignored))
    values = {k: v for k, v in section.items() if k not in ignored}
    if isinstance(values.get("attention_type"), str):  # CREDIT lower-cases it; "none" is no attention
        values["attention_type"] = None if values["attention_type"].lower() == "none" else values["attention_type"].lower()
    return kind, {**DEFAULTS[kind], **values}


def ignored_keys(section: Mapping[str, Any]) -> list[str]:
    """The keys of a CREDIT `model:` section that CREDIT's class takes and ignores."""
    kind = credit_type(section.get("type"))
    if "padding_conf" in DEFAULTS[kind]:
        section = _parser_padding(section)
    handled = {"post_conf"} if kind in POST_BLOCK_TYPES else set()
    return sorted(set(section) - {"type"} - _ACTS_ON_INACTIVE[kind] - set(DEFAULTS[kind]) - handled)


# A gen2 config (`data.source`) runs CREDIT's post_conf differently in each of CREDIT's gen2
# programs; the conversion keeps the gen1 meaning, which the config's thresholds are written in.
GEN2_POST_CONF = ("this is a gen2 config: CREDIT's train_gen2.py ignores model.post_conf and its "
                  "rollout_to_netcdf_gen2.py applies the tracer fixer to normalised values (denorm: false); "
                  "credit applies model.post_conf as CREDIT's gen1 trainer and rollout do, in physical units")


def post_conf_overrides(section: Mapping[str, Any], data: Mapping[str, Any] | None,
                        config_dir: Any = None) -> tuple[list[str], list[str]]:
    """(overrides, ignored keys) that give a run the post blocks of a CREDIT `model:` section:
    `model.post_conf.*` for each active fixer's keys (and the mass fixer's grid keys, which
    every conservation fixer reads), and `data.physics_file` from CREDIT's
    `data.save_loc_physics` (made absolute when found beside the config or in the working
    directory). Keys of an active fixer that CREDIT does not read (e.g. the water fixer's own
    `grid_type`) are returned as ignored. Empty when no post block is active."""
    post_conf = section.get("post_conf")
    if credit_type(section.get("type")) not in POST_BLOCK_TYPES or not isinstance(post_conf, Mapping):
        return [], []
    inside, outside = active_fixers(post_conf)
    active = [name for name in FIXERS if name in inside + outside]
    if not active:
        return [], []
    overrides, ignored = ["model.post_conf.activate=true"], []
    conservation = [name for name in active if name != "tracer_fixer"]
    for name in FIXERS:
        conf = dict(post_conf.get(name) or {})
        keys = POST_CONF_KEYS[name] if name in active else ()
        if name == "global_mass_fixer" and conservation:
            keys = tuple(dict.fromkeys((*keys, *_MASS_GRID)))
        for key in keys:
            if key in conf:
                value = conf[key]
                if key in ("tracer_thres", "tracer_thres_max") and value is not None:
                    value = [float(v) for v in value]  # CREDIT's parser reads YAML's "1e-10" (a string) so
                overrides.append(f"model.post_conf.{name}.{key}={hydra_value(value)}")
        if name in active:
            ignored += [f"post_conf.{name}.{key}" for key in conf
                        if key not in POST_CONF_KEYS[name] and key != "simple_demo"]
    ignored += [f"post_conf.{key}" for key in post_conf if key not in ("activate", *FIXERS, *OTHER_MODULES)]
    if conservation and data is not None and data.get("save_loc_physics"):
        value = data["save_loc_physics"]
        try:
            value = resolve_path(value, "data.save_loc_physics", Path(config_dir or ".")).resolve()
        except PostBlockConfigError:
            pass  # not on this machine: the run names data.physics_file if it is still missing
        overrides.append(f"data.physics_file={value}")
    return overrides, sorted(ignored)


def hydra_value(value: Any) -> str:
    """A value as a hydra command-line override writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):  # quoted unless plainly a word, a number or a path
        plain = value and all(c.isalnum() or c in "_-./" for c in value)
        return value if plain else "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


def _parser_padding(section: dict[str, Any]) -> dict[str, Any]:
    """What CREDIT's config parser (`credit/parser.py`, run by its trainer and rollout) does
    to the padding keys before the model is built: model-level `pad_lat` and `pad_lon`
    without a `padding_conf` become mirror padding, and a single pad size n becomes [n, n]."""
    section = dict(section)
    conf = section.get("padding_conf")
    if conf is None and "pad_lat" in section and "pad_lon" in section:
        lat, lon = int(section.pop("pad_lat")), int(section.pop("pad_lon"))
        section["padding_conf"] = {"activate": True, "mode": "mirror", "pad_lat": [lat, lat], "pad_lon": [lon, lon]}
    elif isinstance(conf, Mapping) and conf.get("activate", False):
        section["padding_conf"] = {key: [value, value] if key in ("pad_lat", "pad_lon") and isinstance(value, int)
                                   else value for key, value in conf.items()}
    return section


def count_parameters(kind: str, values: Mapping[str, Any]) -> tuple[int, int]:
    """(CREDIT's parameter count, this project's) of the model, built on the meta device.

    CREDIT's two CrossFormers also build a `cube_embedding` (a Conv3d over the frames and a
    LayerNorm) that they never call at patch size 1; this project leaves it out, so its
    count is lower by exactly that. Spectral norm adds no parameters (u and v are buffers),
    so the count is taken without it (its power iterations are slow on the meta device)."""
    import torch

    with torch.device("meta"):
        model = build_credit_model(kind, {**values, "use_spectral_norm": False})
    ours = sum(p.numel() for p in model.parameters())
    if kind == "nextgen_wxformer":
        return ours, ours
    spec = credit_spec(values)
    in_channels, width = spec.frame_channels * spec.frames, spec.dim[0]
    cube_embedding = width * in_channels * spec.frames + width + 2 * width  # Conv3d (T, 1, 1) + LayerNorm
    return ours + cube_embedding, ours


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
                            upsample_v_conv=bool(values["upsample_v_conv"]),
                            attention_type=values["attention_type"], gemm=gemm)
        normalised = [model]
    elif kind == "crossformer-ensemble":
        model = CrossFormerEnsemble(
            spec, noise_latent_dim=int(values["noise_latent_dim"]),
            encoder_noise_factor=float(values["encoder_noise_factor"]),
            decoder_noise_factor=float(values["decoder_noise_factor"]), encoder_noise=bool(values["encoder_noise"]),
            freeze=bool(values["freeze"]), correlated=bool(values["correlated"]), interp=bool(values["interp"]),
            padding=padding_from_conf(values["padding_conf"]), upsample_v_conv=bool(values["upsample_v_conv"]),
            attention_type=values["attention_type"], gemm=gemm)
        # CREDIT normalises the CrossFormer before it adds the noise layers
        normalised = [model.layers, model.up_block1, model.up_block2, model.up_block3, model.up_block4]
    elif kind == "wxformer":
        model = WXFormer(spec, interp=bool(values["interp"]), padding=padding_from_conf(values["padding_conf"]),
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
