"""The convolution blocks of CREDIT's `crossformer`, `wxformer` and `nextgen_wxformer`, with CREDIT's
state-dict keys and arithmetic: the cross-scale embedding of each encoder stage, the
sub-pixel decoder's up blocks and output head, and the bilinear resize.

Under sequence parallelism with the whole model on rows (`credit.parallel.sequence`;
`sequence_mesh` set) each block works on this rank's rows of an NCHW tensor: convolutions
take the rows they reach from the neighbouring ranks (`halo_rows`), group norms sum their
statistics over the ranks, pixel shuffles stay local.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from credit.kernels.gemm import det_linear
from credit.models.fanout import fan_out
from credit.models.layer_kit import layer_kit
from credit.parallel.sequence import all_reduce_sum, halo_rows


class CrossEmbedLayer(nn.Module):
    """Strided convolutions of several kernel sizes, concatenated along channels; each
    branch is CREDIT's (ZeroPad2d, Conv2d) pair, padded so all land on the same grid."""

    sequence_mesh: DeviceMesh | None = None  # the whole model on rows: x is this rank's rows

    def __init__(self, dim_in: int, dim_out: int, kernel_sizes: tuple[int, ...], stride: int,
                 gemm: str = "fast") -> None:
        super().__init__()
        conv = layer_kit(gemm).conv
        self.ordered_fan_out = gemm == "deterministic"  # three or more readers of x
        kernels = sorted(kernel_sizes)
        widths = [int(dim_out / 2 ** i) for i in range(1, len(kernels))]
        widths.append(dim_out - sum(widths))
        self.convs = nn.ModuleList()
        for kernel, width in zip(kernels, widths):
            total = kernel - stride
            left = total // 2
            self.convs.append(nn.Sequential(
                nn.ZeroPad2d((left, total - left, left, total - left)),
                conv(dim_in, width, kernel, stride=stride),
            ))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_mesh is not None:
            return torch.cat([self._branch_on_rows(pad, conv, x) for pad, conv in self.convs], dim=1)
        inputs = fan_out(x, len(self.convs)) if self.ordered_fan_out else [x] * len(self.convs)
        return torch.cat([conv(xi) for conv, xi in zip(self.convs, inputs)], dim=1)

    def halo(self) -> int:
        """The most rows a branch reaches into a neighbouring rank's rows."""
        return max(max(pad.padding[2:]) for pad, _ in self.convs)

    def _branch_on_rows(self, pad: nn.ZeroPad2d, conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
        left, right, top, bottom = pad.padding  # rows from the neighbours, zeros along W
        return conv(F.pad(halo_rows(x, top, bottom, self.sequence_mesh), (left, right, 0, 0)))

    def sequence_partial_parameters(self) -> list[str]:
        """On rows, every weight's gradient covers this rank's rows only."""
        return [name for name, _ in self.named_parameters()] if self.sequence_mesh is not None else []


def icnr_(weight: torch.Tensor, scale: int) -> None:
    """Initialise a sub-pixel convolution so its pixel-shuffled output starts as a
    nearest-neighbour upsampling (all scale² sub-pixels share one kernel)."""
    sub = torch.empty(weight.shape[0] // scale ** 2, *weight.shape[1:], dtype=weight.dtype)
    nn.init.kaiming_normal_(sub)
    with torch.no_grad():
        weight.copy_(sub.repeat_interleave(scale ** 2, dim=0))


class UpBlockPS(nn.Module):
    """Sub-pixel upsampling (3x3 convolution, pixel shuffle), a sharpening residual, then a
    residual stack of (3x3 convolution, GroupNorm, SiLU) pairs."""

    sequence_mesh: DeviceMesh | None = None  # the whole model on rows: x is this rank's rows

    def __init__(self, in_ch: int, out_ch: int, num_groups: int, scale: int = 2,
                 num_residuals: int = 2, gemm: str = "fast") -> None:
        super().__init__()
        kit = layer_kit(gemm)
        self.conv = kit.conv(in_ch, out_ch * scale ** 2, 3, padding=1)
        icnr_(self.conv.weight, scale)
        nn.init.zeros_(self.conv.bias)
        self.ps = nn.PixelShuffle(scale)
        self.sharp = kit.conv(out_ch, out_ch, 3, padding=1)
        nn.init.xavier_normal_(self.sharp.weight)
        nn.init.zeros_(self.sharp.bias)
        stack: list[nn.Module] = []
        for _ in range(num_residuals):
            stack += [kit.conv(out_ch, out_ch, 3, padding=1), kit.group_norm(num_groups, out_ch), kit.silu()]
        self.b = nn.Sequential(*stack)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mesh = self.sequence_mesh
        if mesh is None:
            x = self.ps(self.conv(x))
            x = x + self.sharp(x)
            return self.b(x) + x
        x = self.ps(conv_on_rows(self.conv, x, mesh))  # a row's sub-pixels stay on its rank
        x = x + conv_on_rows(self.sharp, x, mesh)
        y = x
        for layer in self.b:
            if isinstance(layer, nn.GroupNorm):
                y = group_norm_on_rows(layer, y, mesh)
            elif isinstance(layer, nn.Conv2d):
                y = conv_on_rows(layer, y, mesh)
            else:
                y = layer(y)
        return y + x

    def sequence_partial_parameters(self) -> list[str]:
        """On rows, every weight's gradient covers this rank's rows only."""
        return [name for name, _ in self.named_parameters()] if self.sequence_mesh is not None else []


def conv_on_rows(conv: nn.Conv2d, x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """A stride-1 'same' convolution of this rank's rows: the rows its padding reaches from
    the neighbours, then the layer itself (its own zero padding then only adds rows it
    drops). Its weight gradient is this rank's part (`sequence_partial_parameters`)."""
    reach = conv.padding[0]
    if conv.stride != (1, 1) or conv.kernel_size[0] != 2 * reach + 1:
        raise ValueError(f"conv_on_rows needs a stride-1 convolution padded to its size, got {conv}")
    y = conv(halo_rows(x, reach, reach, mesh))
    return y[:, :, reach:y.shape[2] - reach].contiguous() if reach else y


def group_norm_on_rows(norm: nn.GroupNorm, x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """GroupNorm of an NCHW tensor whose rows are split over the tp ranks: each group's mean
    and variance summed over every rank's rows (two passes, as torch's), the affine local."""
    b, c, h, w = x.shape
    grouped = x.reshape(b, norm.num_groups, -1)
    count = grouped.shape[-1] * mesh.size()
    mean = all_reduce_sum(grouped.sum(-1, keepdim=True), mesh) / count
    centered = grouped - mean
    var = all_reduce_sum(centered.square().sum(-1, keepdim=True), mesh) / count
    normed = (centered * torch.rsqrt(var + norm.eps)).reshape(b, c, h, w)
    if not norm.affine:
        return normed
    return normed * norm.weight[None, :, None, None] + norm.bias[None, :, None, None]


class OutputHead(nn.Sequential):
    """CREDIT's last up block: a sub-pixel convolution to the output channels, pixel
    shuffle, and a 3x3 convolution (`up_block4.0`, `up_block4.2`)."""

    sequence_mesh: DeviceMesh | None = None  # the whole model on rows: x is this rank's rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_mesh is None:
            return super().forward(x)
        first, shuffle, last = self
        return conv_on_rows(last, shuffle(conv_on_rows(first, x, self.sequence_mesh)), self.sequence_mesh)

    def sequence_partial_parameters(self) -> list[str]:
        """On rows, every weight's gradient covers this rank's rows only."""
        return [name for name, _ in self.named_parameters()] if self.sequence_mesh is not None else []


def output_head(in_ch: int, out_ch: int, icnr: bool, scale: int = 2, gemm: str = "fast") -> OutputHead:
    """The `OutputHead` from `in_ch` channels, ICNR-initialised when `icnr`."""
    conv = layer_kit(gemm).conv
    first = conv(in_ch, out_ch * scale ** 2, 3, padding=1)
    if icnr:
        icnr_(first.weight, scale)
        nn.init.zeros_(first.bias)
    return OutputHead(first, nn.PixelShuffle(scale), conv(out_ch, out_ch, 3, padding=1))


def resize(x: torch.Tensor, size: tuple[int, int], deterministic: bool = False) -> torch.Tensor:
    """Bilinear resize (align_corners=False, as CREDIT); the identity when the size matches.

    `deterministic`: the same interpolation as two products with small interpolation
    matrices through the deterministic GEMM (rows along H, then along W), because torch's
    bilinear backward scatters with atomic adds on CUDA; each output row depends on its own
    input row only, so the result does not depend on the batch either."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    if not deterministic:
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)
    height, width = x.shape[-2:]
    rows_h = interpolation_matrix(height, size[0], x.dtype, x.device)
    rows_w = interpolation_matrix(width, size[1], x.dtype, x.device)
    along_h = det_linear(x.transpose(-1, -2), rows_h).transpose(-1, -2)  # (..., H_out, W)
    return det_linear(along_h.contiguous(), rows_w)  # (..., H_out, W_out)


@functools.lru_cache(maxsize=64)
def interpolation_matrix(size_in: int, size_out: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(size_out, size_in) weights of 1-D linear interpolation with torch's
    align_corners=False rule: source = (i + 0.5)·in/out − 0.5, clamped at 0."""
    scale = size_in / size_out
    source = ((torch.arange(size_out, dtype=torch.float64) + 0.5) * scale - 0.5).clamp(min=0.0)
    lower = source.floor().long().clamp(max=size_in - 1)
    upper = (lower + 1).clamp(max=size_in - 1)
    frac = source - lower
    weights = (F.one_hot(lower, size_in) * (1.0 - frac)[:, None] + F.one_hot(upper, size_in) * frac[:, None])
    return weights.to(dtype=dtype, device=device)
