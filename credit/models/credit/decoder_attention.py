"""The decoder attention blocks of CREDIT's older `crossformer` (`attention_type`), with
CREDIT's state-dict keys and arithmetic: one block after each of the first three up blocks.

| attention_type | block |
| --- | --- |
| `eca` | channel gate: global mean, a 1-D convolution across channels, sigmoid |
| `spatial` | pixel gate: channel mean and max, a 7x7 convolution, sigmoid |
| `scse_standard` / `scse_optimized` | channel gate + pixel gate, added (the pixel gate's 1x1 convolution, or a depthwise then a pointwise one) |
| `mixed` | `eca`, then `spatial` |
| `coordinate` | gates along rows and along columns from pooled strips, through a BatchNorm |

`deterministic=True` computes the same values with every reduction that reaches a gradient
in a fixed order independent of the batch: means and sums as products with a ones vector
through the deterministic GEMM, gate gradients the same way (`_Gate`), convolutions by the
fixed-tree convolution. `coordinate` normalises by batch statistics (BatchNorm), which no
order can make batch-invariant, so deterministic mode refuses it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from credit.kernels.gemm import det_linear
from credit.models.deterministic.layers import ConvGeometry, det_conv2d
from credit.models.deterministic.norms import channel_affine
from credit.models.deterministic.pointwise import sigmoid
from credit.models.layer_kit import layer_kit

TYPES = ("coordinate", "eca", "spatial", "scse_optimized", "scse_standard", "mixed")
REDUCTION, SPATIAL_KERNEL = 32, 7  # what CREDIT's UpBlock passes to its attention factory


def _sum_last(t: torch.Tensor) -> torch.Tensor:
    """Sum over the last dimension in the GEMM's fixed order, each row alone."""
    ones = torch.ones(1, t.shape[-1], dtype=t.dtype, device=t.device)
    return det_linear(t.contiguous(), ones).squeeze(-1)


def pixel_mean(x: torch.Tensor, deterministic: bool) -> torch.Tensor:
    """(B, C, 1, 1) mean over the grid of (B, C, H, W), as AdaptiveAvgPool2d(1)."""
    if not deterministic:
        return F.adaptive_avg_pool2d(x, 1)
    b, c, h, w = x.shape
    return (_sum_last(x.reshape(b, c, h * w)) / (h * w)).view(b, c, 1, 1)


def channel_mean(x: torch.Tensor, deterministic: bool) -> torch.Tensor:
    """(B, 1, H, W) mean over channels of (B, C, H, W)."""
    if not deterministic:
        return torch.mean(x, dim=1, keepdim=True)
    return (_sum_last(x.permute(0, 2, 3, 1)) / x.shape[1]).unsqueeze(1)


class _Gate(torch.autograd.Function):
    """`x * gate` with the gate broadcast over the grid (B, C, 1, 1) or the channels
    (B, 1, H, W); the gate's gradient summed in the GEMM's fixed order."""

    @staticmethod
    def forward(ctx, x, gate):  # type: ignore[override]
        ctx.save_for_backward(x, gate)
        return x * gate

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        x, gate = ctx.saved_tensors
        products = grad * x
        if gate.shape[1] == 1:  # per pixel: summed over channels
            g_gate = _sum_last(products.permute(0, 2, 3, 1)).unsqueeze(1)
        else:  # per channel: summed over the grid
            b, c, h, w = products.shape
            g_gate = _sum_last(products.reshape(b, c, h * w)).view(b, c, 1, 1)
        return grad * gate, g_gate


def gate(x: torch.Tensor, weights: torch.Tensor, deterministic: bool) -> torch.Tensor:
    return _Gate.apply(x, weights) if deterministic else x * weights


class ECABlock(nn.Module):
    """Channel gate from a 1-D convolution across the pooled channels (kernel from C)."""

    def __init__(self, channels: int, deterministic: bool = False) -> None:
        super().__init__()
        k = int(abs((math.log2(channels) + 1) / 2))
        k = k if k % 2 else k + 1
        self.deterministic = deterministic
        self.conv = nn.Conv1d(1, 1, kernel_size=k, padding=k // 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = pixel_mean(x, self.deterministic)  # (B, C, 1, 1)
        if self.deterministic:  # the 1-D convolution as a (1, k) one over a (B, 1, 1, C) image
            k = self.conv.kernel_size[0]
            weights = det_conv2d(pooled.view(x.shape[0], 1, 1, -1), self.conv.weight.unsqueeze(2), None,
                                 ConvGeometry((1, k), padding=(0, k // 2)))
            weights = weights.view(x.shape[0], -1, 1, 1)
        else:
            weights = self.conv(pooled.squeeze(-1).transpose(-1, -2)).transpose(-1, -2).unsqueeze(-1)
        return gate(x, sigmoid(weights, self.deterministic), self.deterministic)


class SpatialAttention(nn.Module):
    """Pixel gate from the channel mean and max through one k x k convolution."""

    def __init__(self, kernel_size: int = SPATIAL_KERNEL, gemm: str = "fast") -> None:
        super().__init__()
        self.deterministic = gemm == "deterministic"
        self.conv = layer_kit(gemm).conv(2, 1, kernel_size=kernel_size, padding=kernel_size // 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stacked = torch.cat([channel_mean(x, self.deterministic), torch.amax(x, dim=1, keepdim=True)], dim=1)
        return gate(x, sigmoid(self.conv(stacked), self.deterministic), self.deterministic)


class DepthwiseScale(nn.Conv2d):
    """A 1x1 depthwise convolution (one weight per channel); deterministic mode applies it
    as a per-channel scale whose gradient is the fixed row tree."""

    deterministic = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.deterministic:
            return super().forward(x)
        scaled = channel_affine(x.permute(0, 2, 3, 1), self.weight.view(-1), None)
        return scaled.permute(0, 3, 1, 2).contiguous()


class SCSEAttention(nn.Module):
    """Channel squeeze-excitation plus spatial squeeze-excitation, summed."""

    def __init__(self, channels: int, reduction: int = REDUCTION, depthwise: bool = False,
                 gemm: str = "fast") -> None:
        super().__init__()
        kit = layer_kit(gemm)
        conv = kit.conv
        self.deterministic = gemm == "deterministic"
        reduced = max(channels // reduction, 8)
        self.cse = nn.Sequential(nn.AdaptiveAvgPool2d(1), conv(channels, reduced, 1, bias=False), nn.ReLU(),
                                 conv(reduced, channels, 1, bias=False), kit.sigmoid())
        pointwise = [conv(channels, 1, 1, bias=False), kit.sigmoid()]
        if depthwise:
            depth = DepthwiseScale(channels, channels, 1, groups=channels, bias=False)
            depth.deterministic = self.deterministic
            pointwise.insert(0, depth)
        self.sse = nn.Sequential(*pointwise)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channel_weights = pixel_mean(x, self.deterministic)
        for layer in list(self.cse)[1:]:
            channel_weights = layer(channel_weights)
        return gate(x, channel_weights, self.deterministic) + gate(x, self.sse(x), self.deterministic)


class MixedAttention(nn.Module):
    """The channel gate of `ECABlock`, then the pixel gate of `SpatialAttention`."""

    def __init__(self, channels: int, gemm: str = "fast") -> None:
        super().__init__()
        self.channel_attention = ECABlock(channels, deterministic=gemm == "deterministic")
        self.spatial_attention = SpatialAttention(SPATIAL_KERNEL, gemm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.spatial_attention(self.channel_attention(x))


class CoordinateAttention(nn.Module):
    """Row and column gates from the grid pooled along each axis, through a shared 1x1
    convolution, BatchNorm and SiLU (fast mode only: batch statistics)."""

    def __init__(self, channels: int, reduction: int = REDUCTION) -> None:
        super().__init__()
        hidden = max(8, channels // reduction)
        self.conv1 = nn.Conv2d(channels, hidden, kernel_size=1)
        self.bn1 = nn.BatchNorm2d(hidden)
        self.act = nn.SiLU()
        self.conv_h = nn.Conv2d(hidden, channels, kernel_size=1)
        self.conv_w = nn.Conv2d(hidden, channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        rows = x.mean(dim=3, keepdim=True)  # (B, C, H, 1)
        cols = x.mean(dim=2, keepdim=True).permute(0, 1, 3, 2)  # (B, C, W, 1)
        y = self.act(self.bn1(self.conv1(torch.cat([rows, cols], dim=2))))
        rows, cols = torch.split(y, [h, w], dim=2)
        return x * torch.sigmoid(self.conv_h(rows)) * torch.sigmoid(self.conv_w(cols.permute(0, 1, 3, 2)))


def decoder_attention(kind: str | None, channels: int, gemm: str = "fast") -> nn.Module | None:
    """CREDIT's `load_unet_attention(kind, channels, 32, 7)`; None for no attention.
    Raises ValueError naming `model.attention_type` for an unknown kind, or `coordinate` in
    deterministic mode."""
    if kind is None or kind.lower() == "none":
        return None
    kind = kind.lower()
    if kind not in TYPES:
        raise ValueError(f"model.attention_type={kind!r} is not one of {['none', *TYPES]}")
    if kind == "coordinate" and gemm == "deterministic":
        raise ValueError("model.attention_type='coordinate' normalises by batch statistics (BatchNorm2d), "
                         "which cannot be batch-invariant: with model.gemm=deterministic use one of "
                         f"{[t for t in TYPES if t != 'coordinate']}")
    if kind == "coordinate":
        return CoordinateAttention(channels)
    if kind == "eca":
        return ECABlock(channels, deterministic=gemm == "deterministic")
    if kind == "spatial":
        return SpatialAttention(SPATIAL_KERNEL, gemm)
    if kind == "mixed":
        return MixedAttention(channels, gemm)
    return SCSEAttention(channels, depthwise=kind == "scse_optimized", gemm=gemm)
