"""CREDIT's `crossformer`: its older CrossFormer (`credit.models.crossformer.CrossFormer`),
the class CREDIT's 0.25° production configs, its arXiv-2024 configs and its 1° configs name.

The encoder is the current class's (`credit.models.credit.wxformer`), with CREDIT's keys; only the
cross-embedding pads each branch (k - s) / 2 on every side. The decoder differs: each up
block doubles the grid with a transposed convolution (kernel 2, stride 2) or, with
`upsample_v_conv`, a bilinear x2 and a 3x3 convolution, then a residual stack of
(3x3 convolution, GroupNorm, SiLU) pairs and an optional attention block
(`credit.models.credit.decoder_attention`); the output head is a transposed convolution
(kernel 4, stride 2, padding 1) or bilinear x2 + 3x3 convolution.

Takes and returns CREDIT's layout, (B, C, T, H, W) -> (B, C_out, 1, H, W), through
`WXFormer`'s forward. Under sequence parallelism its transformer stages run on rows; the
decoder runs whole.
"""

from __future__ import annotations

import torch
from torch import nn

from credit.models.credit.convs import resize
from credit.models.padding import BoundaryPadding
from credit.models.credit.decoder_attention import decoder_attention
from credit.models.layer_kit import layer_kit
from credit.models.credit.wxformer import CreditSpec, WXFormer


class Bilinear2x(nn.Module):
    """nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False); deterministic mode
    as interpolation-matrix products (`resize`)."""

    def __init__(self, deterministic: bool = False) -> None:
        super().__init__()
        self.deterministic = deterministic

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return resize(x, (2 * x.shape[-2], 2 * x.shape[-1]), self.deterministic)


class UpBlock(nn.Module):
    """Double the grid (transposed convolution, or bilinear + convolution), add a residual
    stack of (convolution, GroupNorm, SiLU) pairs, then the optional attention block."""

    def __init__(self, in_ch: int, out_ch: int, num_groups: int, *, upsample_v_conv: bool,
                 attention_type: str | None, num_residuals: int = 2, gemm: str = "fast") -> None:
        super().__init__()
        kit = layer_kit(gemm)
        self.upsample = Bilinear2x(gemm == "deterministic") if upsample_v_conv else None
        if upsample_v_conv:
            self.conv = kit.conv(in_ch, out_ch, kernel_size=3, stride=1, padding=1)
        else:
            self.conv = kit.conv_transpose(in_ch, out_ch, kernel_size=2, stride=2)
        stack: list[nn.Module] = []
        for _ in range(num_residuals):
            stack += [kit.conv(out_ch, out_ch, 3, padding=1), kit.group_norm(num_groups, out_ch), kit.silu()]
        self.b = nn.Sequential(*stack)
        self.attention = decoder_attention(attention_type, out_ch, gemm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.upsample is not None:
            x = self.upsample(x)
        x = self.conv(x)
        x = self.b(x) + x
        return self.attention(x) if self.attention is not None else x


def output_head(in_ch: int, out_ch: int, upsample_v_conv: bool, gemm: str) -> nn.Module:
    """`up_block4`: bilinear x2 + 3x3 convolution (`up_block4.1`), or a kernel-4 stride-2
    transposed convolution (`up_block4`)."""
    kit = layer_kit(gemm)
    if upsample_v_conv:
        return nn.Sequential(Bilinear2x(gemm == "deterministic"), kit.conv(in_ch, out_ch, 3, stride=1, padding=1))
    return kit.conv_transpose(in_ch, out_ch, kernel_size=4, stride=2, padding=1)


def check_even_padding(spec: CreditSpec) -> None:
    """CREDIT pads each cross-embedding branch (k - s) // 2 on both sides: with an odd
    k - s a branch lands one row short, so the stages would not tile as configured."""
    for stage, (kernels, stride) in enumerate(zip(spec.cross_embed_kernel_sizes, spec.cross_embed_strides)):
        odd = [k for k in kernels if (k - stride) % 2 or k < stride]
        if odd:
            raise ValueError(f"model.cross_embed_kernel_sizes[{stage}]={list(kernels)}: crossformer needs each "
                             f"kernel >= the stride {stride} and differing from it by an even number, got {odd}")


class CrossFormer(WXFormer):
    """CREDIT's older CrossFormer (registry type `crossformer`): `WXFormer`'s encoder and
    forward with the older decoder; state-dict keys are CREDIT's once its 1x1-convolution
    projections are in Linear form."""

    credit_type = "crossformer"

    def __init__(self, spec: CreditSpec, *, interp: bool = True, padding: BoundaryPadding | None = None,
                 upsample_v_conv: bool = False, attention_type: str | None = None, gemm: str = "fast") -> None:
        check_even_padding(spec)
        super().__init__(spec, interp=interp, padding=padding, gemm=gemm, upsample_v_conv=upsample_v_conv,
                         attention_type=attention_type)

    def build_decoder(self, spec: CreditSpec, gemm: str, *, upsample_v_conv: bool = False,
                      attention_type: str | None = None) -> None:
        last, groups = spec.dim[-1], spec.dim[0]
        blocks = dict(upsample_v_conv=upsample_v_conv, attention_type=attention_type, gemm=gemm)
        self.up_block1 = UpBlock(last, last // 2, groups, **blocks)
        self.up_block2 = UpBlock(last, last // 4, groups, **blocks)
        self.up_block3 = UpBlock(last // 2, last // 8, groups, **blocks)
        self.up_block4 = output_head(last // 4, spec.output_channels, upsample_v_conv, gemm)

    def sequence_rows_fit(self, tp: int) -> str | None:
        """Only the transformer stages run on rows: the transposed convolutions and decoder
        attention (global means) work on the whole grid."""
        return "the older CrossFormer's decoder runs on the whole grid"
