"""What `model.gemm` changes in the windowformer: the layer classes, and the tp-shard helpers
the deterministic blocks use (see docs/determinism.md)."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import torch
from torch import nn

from credit.kernels.gemm import DetLinear
from credit.models.deterministic.layers import DetConv2d, DetConvTranspose2d
from credit.models.deterministic.norms import DetGroupNorm, DetLayerNorm
from credit.models.deterministic.pointwise import DetGELU, DetSigmoid, DetSiLU


def layer_kit(gemm: str) -> SimpleNamespace:
    """The layer classes of a mode: torch's, or the fixed-tree ones (same parameters and
    state-dict keys) whose batch reductions group rows per sample."""
    if gemm == "deterministic":
        return SimpleNamespace(linear=partial(DetLinear, group_rows=True), layer_norm=DetLayerNorm,
                               group_norm=DetGroupNorm, conv=DetConv2d, conv_transpose=DetConvTranspose2d,
                               gelu=DetGELU, silu=DetSiLU, sigmoid=DetSigmoid)
    return SimpleNamespace(linear=nn.Linear, layer_norm=nn.LayerNorm, group_norm=nn.GroupNorm,
                           conv=nn.Conv2d, conv_transpose=nn.ConvTranspose2d, gelu=nn.GELU, silu=nn.SiLU,
                           sigmoid=nn.Sigmoid)


def shard_of(weight: torch.Tensor) -> tuple[int, int]:
    """(offset, global size) of this rank's rows of a colwise weight (0, rows if unsharded)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(weight, DTensor):
        return 0, weight.shape[0]
    _, offset = compute_local_shape_and_global_offset(weight.shape, weight.device_mesh, weight.placements)
    return offset[0], weight.shape[0]


def mark_whole_reductions(model: nn.Module) -> None:
    """Tell each DetLinear which of its reductions no tensor-parallel split ever cuts, from the
    blocks' `_tp_plan`s (the plan, not the layout, so one process marks what tp ranks mark):
    a colwise layer's forward K and a rowwise layer's input-gradient N stay whole on every
    rank, as do both of a layer no plan names. The triton backend runs those as one MMA chain
    (docs/kernels.md); the rest keep the K tree that tp partial sums need."""
    for layer in model.modules():
        if isinstance(layer, DetLinear):
            layer.whole_reductions = (True, True)
    for block in model.modules():
        for path, style in (getattr(block, "_tp_plan", None) or {}).items():
            try:
                layer = block.get_submodule(path)
            except AttributeError:  # a plan path a variant of the block lacks
                continue
            if isinstance(layer, DetLinear):
                layer.whole_reductions = (style == "colwise", style == "rowwise")
