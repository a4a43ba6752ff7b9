"""The matrix products a model's projections run, traced on the meta device.

A forward pass over a meta tensor computes nothing and allocates nothing, so the shapes of a
0.25-degree model are known in seconds on any machine. Each linear layer and each 1x1
convolution is one GEMM of (M rows = tokens, K = input width, N = output width); attention's
batched products and the wider convolutions are not counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from credit.models.credit.config import build_credit_model, resolve_credit_model
from credit.models.credit.layers import DynamicPositionBias

GemmShape = tuple[int, int, int]


def projection_gemms(model: nn.Module, forward: Callable[[nn.Module], object]) -> Counter[GemmShape]:
    """How often each (M, K, N) product runs while `forward(model)` runs.

    `model` must hold meta parameters (built under `torch.device("meta")`) and `forward`
    must feed it meta tensors. The position-bias MLPs (a few hundred window offsets each,
    not tokens) are left out.
    """
    devices = {p.device.type for p in model.parameters()}
    if devices != {"meta"}:
        raise ValueError(f"the model's parameters must all be on the meta device, found {sorted(devices)}")
    counts: Counter[GemmShape] = Counter()

    def record(module: nn.Module, inputs: tuple[torch.Tensor, ...], _output: object) -> None:
        x = inputs[0]
        if isinstance(module, nn.Linear):
            shape = (x.numel() // x.shape[-1], module.in_features, module.out_features)
        else:  # a 1x1 convolution: every pixel is a row
            shape = (x.numel() // x.shape[1], module.in_channels, module.out_channels)
        counts[shape] += 1

    in_bias_mlps = {id(m) for bias in model.modules() if isinstance(bias, DynamicPositionBias)
                    for m in bias.modules()}
    hooks = [m.register_forward_hook(record) for m in model.modules()
             if id(m) not in in_bias_mlps
             and (isinstance(m, nn.Linear) or (isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1)))]
    try:
        with torch.no_grad():
            forward(model)
    finally:
        for hook in hooks:
            hook.remove()
    return counts


def credit_section_gemms(section: Mapping[str, Any], batch: int = 1) -> Counter[GemmShape]:
    """The projection products of one forward pass of the model a CREDIT `model:` section
    describes (CREDIT's defaults filled in), at `batch` samples on its full grid."""
    kind, values = resolve_credit_model(section)
    with torch.device("meta"):
        model = build_credit_model(kind, values)
    channels = values["channels"] * values["levels"] + values["surface_channels"] + values["input_only_channels"]
    example = torch.empty(batch, channels, values["frames"], values["image_height"], values["image_width"],
                          device="meta")
    return projection_gemms(model, lambda m: m(example))
