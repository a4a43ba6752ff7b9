"""Map a CREDIT state dict in its older convolutional layout onto the Linear layout.

CREDIT's transformer blocks once held their projections as 1x1 convolutions: attention a
fused `to_qkv` with weight (3·inner, dim, 1, 1) -- q, then k, then v along dim 0 -- and
`to_out`, the feed-forward `layers.1` / `layers.4`, with (O, I, 1, 1) kernels. Today each
is an `nn.Linear` with an (O, I) weight, and q, k, v are three Linears. Cross-embedding
convolutions once sat at `convs.<i>` and now at `convs.<i>.1` (behind a ZeroPad2d).

torch's hook-style spectral norm stores `weight_orig` (the raw weight) with the power
iteration vectors `weight_u` (length O) and `weight_v` (length I·kh·kw); this project's
spectral norm keeps the raw weight as `weight` beside the same two vectors.

A fused q/k/v normalised by spectral norm had one σ = uᵀ W v for the three together. In
eval mode a normalised layer divides by uᵀ W v with the stored vectors, so each part gets
v as it was and a u scaled so that u_pᵀ W_p v = σ: the converted model computes what the
fused one computed, exactly. Once training resumes, the power iteration renormalises u and
each part converges to its own σ (as CREDIT's Linear model normalises q, k, v separately).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

# `<block>.<projection>.<suffix>` inside a transformer round `...layers.<round>.<position>`
_ATTENTION_KEY = re.compile(
    r"^(?P<block>(?:.*\.)?layers\.\d+\.\d+)\.(?P<proj>to_qkv|to_q|to_k|to_v|to_out)\.(?P<suffix>[^.]+)$"
)
_FEED_FORWARD_KEY = re.compile(r"^(?:.*\.)?layers\.\d+\.\d+\.layers\.[14]\.(?:weight|weight_orig)$")
_OLD_CROSS_EMBED_KEY = re.compile(r"^(?P<stem>(?:.*\.)?convs)\.(?P<i>\d+)\.(?P<suffix>weight|weight_orig|weight_u|weight_v|bias)$")
_SUFFIXES = ("weight", "weight_orig", "weight_u", "weight_v", "bias")
_HOOK_WEIGHT = ".weight_orig"


class RemapError(ValueError):
    """A state dict entry that is neither the convolutional nor the Linear layout."""


def _as_matrix(key: str, tensor: torch.Tensor) -> torch.Tensor:
    """An (O, I, 1, 1) kernel as an (O, I) matrix; an (O, I) matrix as itself."""
    if tensor.dim() == 4 and tuple(tensor.shape[2:]) == (1, 1):
        return tensor.reshape(tensor.shape[0], tensor.shape[1])
    if tensor.dim() == 2:
        return tensor
    raise RemapError(f"{key} has shape {tuple(tensor.shape)}; a projection weight must be (O, I, 1, 1) "
                     f"(1x1 convolution) or (O, I) (Linear)")


def _thirds(key: str, tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if tensor.shape[0] % 3:
        raise RemapError(f"{key} has shape {tuple(tensor.shape)}; a fused q/k/v tensor needs a first "
                         f"dimension divisible by 3 (q, then k, then v)")
    return tuple(part.clone() for part in torch.chunk(tensor, 3, dim=0))


def _split_fused(block: str, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entries of one fused `to_qkv` (suffix -> tensor) as to_q/to_k/to_v entries."""
    where = f"{block}.to_qkv"
    unknown = sorted(set(parts) - set(_SUFFIXES))
    if unknown:
        raise RemapError(f"{where}.{unknown[0]}: unknown suffix; allowed: {list(_SUFFIXES)}")
    out: dict[str, list[torch.Tensor]] = {}
    weight_key = "weight_orig" if "weight_orig" in parts else "weight"
    if weight_key in parts:
        out[weight_key] = list(_thirds(f"{where}.{weight_key}", _as_matrix(f"{where}.{weight_key}", parts[weight_key])))
    if "bias" in parts:
        out["bias"] = list(_thirds(f"{where}.bias", parts["bias"]))
    if "weight_u" in parts or "weight_v" in parts:
        if not {"weight_u", "weight_v", weight_key} <= set(parts):
            raise RemapError(f"{where} has spectral-norm vectors without all of {weight_key}, weight_u, weight_v")
        u, v = parts["weight_u"].double(), parts["weight_v"].double()
        matrix = _as_matrix(where, parts[weight_key]).double()
        sigma = torch.dot(u, matrix @ v)
        out["weight_v"] = [parts["weight_v"].clone() for _ in range(3)]
        out["weight_u"] = []
        for part in torch.chunk(matrix, 3, dim=0):
            image = part @ v
            out["weight_u"].append((image * (sigma / torch.dot(image, image))).to(parts["weight_u"].dtype))
    return {f"{block}.{proj}.{suffix}": tensors[i]
            for suffix, tensors in out.items() for i, proj in enumerate(("to_q", "to_k", "to_v"))}


def remap_conv_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A new state dict in the Linear layout; the input is left unchanged.

    - `...to_qkv.*` -> `to_q`/`to_k`/`to_v` (weights split in thirds; spectral-norm vectors
      set so each part's σ equals the fused σ, see the module docstring);
    - `to_out`, `to_q`/`to_k`/`to_v` and feed-forward `layers.1`/`layers.4` weights
      (O, I, 1, 1) -> (O, I);
    - `...convs.<i>.<suffix>` -> `...convs.<i>.1.<suffix>` (cross-embedding branches);
    - `weight_orig`, on any layer, -> `weight`.

    Converted entries pass through, so the function is idempotent. Raises RemapError naming
    the key for a shape that is neither layout, an unknown suffix on a projection, or two
    entries that would produce the same key.
    """
    out: dict[str, torch.Tensor] = {}
    sources: dict[str, str] = {}

    def put(name: str, value: torch.Tensor, source: str) -> None:
        if name.endswith(_HOOK_WEIGHT):
            name = name[: -len(_HOOK_WEIGHT)] + ".weight"
        if name in out:
            raise RemapError(f"{source} and {sources[name]} both map to {name}; a state dict holds either "
                             f"the fused to_qkv or separate to_q/to_k/to_v, either weight or weight_orig")
        out[name], sources[name] = value, source

    fused: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            put(key, tensor, key)
            continue
        attention = _ATTENTION_KEY.match(key)
        old_embed = _OLD_CROSS_EMBED_KEY.match(key)
        if attention and attention["proj"] == "to_qkv":
            fused.setdefault(attention["block"], {})[attention["suffix"]] = tensor
        elif attention:
            if attention["suffix"] not in _SUFFIXES:
                raise RemapError(f"{key}: unknown suffix {attention['suffix']!r} on a projection; "
                                 f"allowed: {list(_SUFFIXES)}")
            is_matrix = attention["suffix"] in ("weight", "weight_orig")
            put(key, _as_matrix(key, tensor) if is_matrix else tensor, key)
        elif _FEED_FORWARD_KEY.match(key) and tensor.dim() == 4:
            put(key, _as_matrix(key, tensor), key)
        elif old_embed:
            put(f"{old_embed['stem']}.{old_embed['i']}.1.{old_embed['suffix']}", tensor, key)
        else:
            put(key, tensor, key)
    for block, parts in fused.items():
        for name, tensor in _split_fused(block, parts).items():
            put(name, tensor, f"{block}.to_qkv")
    return out
