"""Map a state dict of the legacy convolutional wxformer layout onto today's Linear layout.

Legacy layout (see `credit.models.legacy`): inside every transformer block, attention holds
one fused 1x1 convolution `to_qkv` with weight (3*inner, dim, 1, 1) -- q, then k, then v
along dim 0 -- and `to_out`, and feed-forward `up`/`down`, are 1x1 convolutions with
(O, I, 1, 1) kernels. Today each of those is an `nn.Linear` with an (O, I) weight, and q,
k, v are three separate Linears.

Only the planned projections are touched, recognised by key path: a module named
`to_qkv`, `to_q`, `to_k`, `to_v`, `to_out`, `up` or `down` directly inside a transformer
block `...layers.<round>.<block>.`. Everything else (cross-embedding and decoder
convolutions, norms, the head) passes through unchanged, however many dimensions it has.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

# `<prefix>layers.<round>.<block>.<projection>.<suffix>`; the prefix may be empty or any path.
_PLANNED_KEY = re.compile(
    r"^(?P<block>(?:.*\.)?layers\.\d+\.\d+)\.(?P<proj>to_qkv|to_q|to_k|to_v|to_out|up|down)"
    r"\.(?P<suffix>[^.]+)$"
)
# Hook-style spectral norm replaces `weight` by `weight_orig` (a parameter) plus the power
# iteration vectors `weight_u` (length O) and `weight_v` (length I, for a conv I*kh*kw).
_SUFFIXES = ("weight", "weight_orig", "weight_u", "weight_v", "bias")
_MATRIX_SUFFIXES = ("weight", "weight_orig")
# today's spectral norm (`credit.models.spectral_norm`) keeps the raw weight as `weight`
_HOOK_WEIGHT = ".weight_orig"


class RemapError(ValueError):
    """A state dict entry that is neither the legacy nor the current layout."""


def _as_matrix(key: str, tensor: torch.Tensor) -> torch.Tensor:
    """An (O, I, 1, 1) kernel as an (O, I) matrix; an (O, I) matrix as itself."""
    if tensor.dim() == 4 and tuple(tensor.shape[2:]) == (1, 1):
        return tensor.reshape(tensor.shape[0], tensor.shape[1])
    if tensor.dim() == 2:
        return tensor
    raise RemapError(
        f"{key} has shape {tuple(tensor.shape)}; a projection weight must be (O, I, 1, 1) "
        f"(legacy 1x1 conv) or (O, I) (Linear)"
    )


def _as_vector(key: str, tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() != 1:
        raise RemapError(f"{key} has shape {tuple(tensor.shape)}; it must be a vector (1-D)")
    return tensor


def _thirds(key: str, tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if tensor.shape[0] % 3:
        raise RemapError(
            f"{key} has shape {tuple(tensor.shape)}; a fused q/k/v tensor needs a first "
            f"dimension divisible by 3 (q, then k, then v)"
        )
    # clone: each part is its own tensor, not a view sharing the fused storage
    return tuple(part.clone() for part in torch.chunk(tensor, 3, dim=0))


def _unit(part: torch.Tensor) -> torch.Tensor:
    # spectral norm keeps `weight_u` unit length and uses it as is in eval mode
    # (sigma = u . W v): a third of a unit vector is not unit length, so rescale it.
    norm = part.norm()
    return part / norm if norm > 0 else part


def _split_qkv(key: str, block: str, suffix: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    names = [f"{block}.{proj}.{suffix}" for proj in ("to_q", "to_k", "to_v")]
    if suffix in _MATRIX_SUFFIXES:
        parts = _thirds(key, _as_matrix(key, tensor))
    elif suffix == "weight_u":
        parts = tuple(_unit(p) for p in _thirds(key, _as_vector(key, tensor)))
    elif suffix == "weight_v":
        # v lives in the shared input space, so every part starts from the fused one
        parts = tuple(_as_vector(key, tensor).clone() for _ in range(3))
    else:  # bias
        parts = _thirds(key, _as_vector(key, tensor))
    return dict(zip(names, parts))


def remap_conv_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A new state dict in today's Linear layout; the input is left unchanged.

    - `...to_qkv.{weight,weight_orig}` (3*inner, dim, 1, 1) -> `to_q`/`to_k`/`to_v` (inner, dim);
    - `...to_qkv.bias` (3*inner,) -> three (inner,) biases;
    - `...to_qkv.weight_u` (3*inner,) -> three parts, each rescaled to unit length;
    - `...to_qkv.weight_v` (dim,) -> copied to all three;
    - `to_out`, `up`, `down` (and `to_q`/`to_k`/`to_v`) `{weight,weight_orig}` (O, I, 1, 1) -> (O, I);
    - hook-style spectral norm's `weight_orig`, on any layer, -> `weight` (today's raw weight
      beside `weight_u` / `weight_v`).

    Already-converted entries pass through, so the function is idempotent. Raises RemapError
    naming the key for an unknown suffix on a projection, a shape that is neither layout,
    or a fused and a separate projection that would produce the same key.
    """
    out: dict[str, torch.Tensor] = {}
    sources: dict[str, str] = {}

    def put(name: str, value: torch.Tensor, source: str) -> None:
        if name.endswith(_HOOK_WEIGHT):
            name = name[: -len(_HOOK_WEIGHT)] + ".weight"
        if name in out:
            raise RemapError(
                f"{source} and {sources[name]} both map to {name}; a state dict holds either the "
                f"fused to_qkv or separate to_q/to_k/to_v, not both"
            )
        out[name], sources[name] = value, source

    for key, tensor in state_dict.items():
        match = _PLANNED_KEY.match(key)
        if match is None or not isinstance(tensor, torch.Tensor):
            put(key, tensor, key)
            continue
        block, proj, suffix = match.group("block", "proj", "suffix")
        if suffix not in _SUFFIXES:
            raise RemapError(f"{key}: unknown suffix {suffix!r} on a projection; allowed: {list(_SUFFIXES)}")
        if proj == "to_qkv":
            for name, part in _split_qkv(key, block, suffix, tensor).items():
                put(name, part, key)
        elif suffix in _MATRIX_SUFFIXES:
            put(key, _as_matrix(key, tensor), key)
        else:
            put(key, _as_vector(key, tensor), key)
    return out
