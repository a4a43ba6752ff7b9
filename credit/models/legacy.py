"""The legacy wxformer layout, executable: 1x1-convolution projections and a fused q/k/v.

`LegacyWXFormer` is today's `WXFormer` with every transformer block's Attention and
FeedForward replaced by the convolutional versions below; the cross-embedding, padding,
norms, decoder and head are today's modules. Its state dict is the legacy layout that
`credit.models.remap_conv_state_dict` converts:

  ...to_qkv.weight  (3*inner, dim, 1, 1)   q, then k, then v along dim 0 (no bias)
  ...to_out.weight  (dim, inner, 1, 1)     ...to_out.bias (dim,)
  ...up.weight      (dim*mult, dim, 1, 1)  ...up.bias     (dim*mult,)
  ...down.weight    (dim, dim*mult, 1, 1)  ...down.bias   (dim,)

The blocks take and return the same channels-last (B, H, W, C) grids as today's; a 1x1
convolution acts on each grid point alone, so projecting the whole grid channels-first
before cutting it into windows computes what today's per-window Linears compute. The
legacy model has no `_tp_plan` (convolutions are not tensor-parallel): it exists to
define and test the layout, and to produce legacy checkpoints; train the converted model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from credit.models.build import model_spec
from credit.models.wxformer import Attention, FeedForward, WXFormer, WXFormerSpec


def _conv1x1(x: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """Apply a 1x1 convolution to a channels-last grid (..., H, W, C), channels-last out."""
    return conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class LegacyAttention(nn.Module):
    """Windowed multi-head attention with a fused 1x1-conv q/k/v and a 1x1-conv output."""

    # the window cut, its inverse and the head arithmetic are today's, so both layouts
    # group points and heads identically
    _init_windows = Attention._init_windows
    _to_windows = Attention._to_windows
    _from_windows = Attention._from_windows
    _attend = Attention._attend

    def __init__(self, dim: int, dim_head: int, window: int, kind: str, dropout: float) -> None:
        super().__init__()
        inner = self._init_windows(dim, dim_head, window, kind, dropout)
        self.to_qkv = nn.Conv2d(dim, 3 * inner, 1, bias=False)
        self.to_out = nn.Conv2d(inner, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = _conv1x1(self.norm(x), self.to_qkv).chunk(3, dim=-1)
        q, k, v = (self._to_windows(t.contiguous()) for t in (q, k, v))
        merged = self._attend(q, k, v)
        width = merged.shape[-1]
        grid_shape = torch.Size((*x.shape[:3], width))
        return _conv1x1(self._from_windows(merged, grid_shape), self.to_out)


class LegacyFeedForward(nn.Module):
    """Pre-norm two-layer MLP whose layers are 1x1 convolutions."""

    def __init__(self, dim: int, mult: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Conv2d(dim, dim * mult, 1)
        self.down = nn.Conv2d(dim * mult, dim, 1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.dropout(F.gelu(_conv1x1(self.norm(x), self.up)))
        return _conv1x1(hidden, self.down)


class LegacyWXFormer(WXFormer):
    """Today's WXFormer with the legacy convolutional Attention and FeedForward blocks."""

    def __init__(self, spec: WXFormerSpec) -> None:
        super().__init__(spec)
        for stage in self.stages:
            for block in stage.layers:
                for i, layer in enumerate(block):
                    if isinstance(layer, Attention):
                        block[i] = LegacyAttention(
                            layer.to_q.in_features, layer.dim_head, layer.window, layer.kind,
                            layer.dropout,
                        )
                    elif isinstance(layer, FeedForward):
                        block[i] = LegacyFeedForward(
                            layer.up.in_features, layer.up.out_features // layer.up.in_features,
                            layer.dropout.p,
                        )


def build_legacy_model(model_cfg: Mapping[str, Any], **layout: Any) -> LegacyWXFormer:
    """The legacy model for the same `model.*` config and data layout as `build_model`."""
    model = LegacyWXFormer(model_spec(model_cfg, **layout))
    if model_cfg.get("use_spectral_norm", False):
        # the legacy checkpoints' format: torch's hook-style weight_orig / weight_u / weight_v
        for module in list(model.modules()):
            if isinstance(module, (nn.Linear, nn.Conv2d, nn.ConvTranspose2d)):
                nn.utils.spectral_norm(module)
    return model
