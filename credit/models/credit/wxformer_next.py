"""CREDIT's `nextgen_wxformer`: the wxformer encoder/decoder plus a learned per-level
embedding and column attention across pressure levels at the input, a spectral-GNN
bottleneck between encoder and decoder, optional column attention on the output, and a
residual output (last input frame + predicted change).

CREDIT's layout in and out, as `wxformer`, except that frames fold time-major
((B, C, T) -> (B, T·C)), as CREDIT's class does. No boundary padding: the grid must tile.

`gemm="deterministic"` (docs/determinism.md): the fixed-tree layers of `layer_kit`, every
product that reduces over the batch grouped by sample (`linear_local(..., groups=B)`), the
column attention's heads written out, and the frames of a sample embedded in one call (so a
parameter used by every frame gets one gradient, not one per frame added in autograd's order).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from credit.kernels.gemm._ops import linear_local
from credit.models.credit.convs import UpBlockPS, output_head, resize
from credit.models.credit.deterministic_attention import recomputed_attention
from credit.models.credit.layers import check_windows, encoder_grids, stage_multiple
from credit.models.credit.wxformer import CreditSpec, build_encoder, check_decoder_widths, number_dropouts
from credit.models.deterministic.norms import channel_affine
from credit.models.layer_kit import layer_kit


class LevelEmbedding(nn.Module):
    """A learned bias per (variable, level) channel of the atmospheric input."""

    def __init__(self, channels: int, levels: int, deterministic: bool = False) -> None:
        super().__init__()
        self.deterministic = deterministic
        self.bias = nn.Parameter(torch.zeros(channels * levels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.deterministic:  # the bias gradient by the row tree, rows grouped by sample
            return channel_affine(x.permute(0, 2, 3, 1), None, self.bias).permute(0, 3, 1, 2)
        return x + self.bias[None, :, None, None]


class PackedAttention(nn.Module):
    """Self-attention with one packed (3C, C) input projection and no biases: the
    parameters (`in_proj_weight`, `out_proj.weight`) and arithmetic of
    `nn.MultiheadAttention(C, heads, bias=False, batch_first=True)`."""

    def __init__(self, dim: int, heads: int, gemm: str = "fast") -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"model.col_attn_heads={heads} must divide model.channels={dim}")
        self.heads, self.deterministic = heads, gemm == "deterministic"
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        nn.init.xavier_uniform_(self.in_proj_weight)
        self.out_proj = layer_kit(gemm).linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., length, dim); in deterministic mode the leading dimension indexes samples."""
        *lead, length, dim = x.shape
        d = dim // self.heads
        if self.deterministic:
            packed = linear_local(x, self.in_proj_weight, None, "auto", groups=x.shape[0])
            q, k, v = (t.reshape(-1, length, self.heads, d).transpose(1, 2).contiguous()
                       for t in packed.chunk(3, dim=-1))
            attended = recomputed_attention(q, k, v, 1.0 / math.sqrt(d))
        else:
            q, k, v = (t.reshape(-1, length, self.heads, d).transpose(1, 2)
                       for t in F.linear(x, self.in_proj_weight).chunk(3, dim=-1))
            attended = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(attended.transpose(1, 2).reshape(*lead, length, dim))


class ColumnAttention(nn.Module):
    """Attention across the pressure levels of each grid column, on the atmospheric
    channels (variable-major, level-minor); optionally on a grid average-pooled by
    `spatial_stride`, the correction resized back bilinearly."""

    def __init__(self, channels: int, levels: int, num_heads: int, spatial_stride: int,
                 gemm: str = "fast") -> None:
        super().__init__()
        kit = layer_kit(gemm)
        self.channels, self.levels, self.spatial_stride = channels, levels, spatial_stride
        self.deterministic = gemm == "deterministic"
        self.norm = kit.layer_norm(channels)
        self.attn = PackedAttention(channels, num_heads, gemm)
        self.proj = kit.linear(channels, channels, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, height, width = x.shape
        pooled = F.avg_pool2d(x, self.spatial_stride) if self.spatial_stride > 1 else x
        h, w = pooled.shape[-2:]
        # (B, columns, levels, channels): the leading dimension stays the sample's
        columns = pooled.reshape(b, self.channels, self.levels, h * w).permute(0, 3, 2, 1)
        delta = self.proj(self.attn(self.norm(columns)))
        delta = delta.reshape(b, h, w, self.levels, self.channels).permute(0, 4, 3, 1, 2).reshape(b, c, h, w)
        return x + resize(delta, (height, width), self.deterministic)


class SpectralGNNBottleneck(nn.Module):
    """Pools the N grid nodes onto K learned virtual nodes (`agg_w`), mixes channels
    there with an MLP, scatters the correction back (`scatter_w`): O(N·K) global mixing."""

    # the channel MLP at the K nodes is a feed-forward: hidden features split across tp ranks
    _tp_plan = {"mlp.0": "colwise", "mlp.2": "rowwise"}

    def __init__(self, dim: int, nodes: int, num_spectral_nodes: int, mlp_ratio: float = 2.0,
                 gemm: str = "fast") -> None:
        super().__init__()
        kit = layer_kit(gemm)
        hidden = max(1, int(dim * mlp_ratio))
        self.deterministic = gemm == "deterministic"
        self.norm = kit.group_norm(1, dim)
        self.agg_w = nn.Parameter(torch.randn(num_spectral_nodes, nodes) * nodes ** -0.5)
        self.scatter_w = nn.Parameter(torch.randn(nodes, num_spectral_nodes) * num_spectral_nodes ** -0.5)
        self.mlp = nn.Sequential(kit.linear(dim, hidden), kit.gelu(), kit.linear(hidden, dim))

    def _nodes(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.deterministic:  # weight gradients reduce each sample's rows as whole leaves
            return linear_local(x, weight, None, "auto", groups=x.shape[0])
        return F.linear(x, weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        flat = self.norm(x).reshape(b, c, h * w)
        spectral = self._nodes(flat, self.agg_w)  # (B, C, K)
        mixed = self.mlp(spectral.transpose(1, 2)).transpose(1, 2)
        delta = self._nodes(mixed.contiguous(), self.scatter_w)  # (B, C, N)
        return x + delta.reshape(b, c, h, w)


class WXFormerNext(nn.Module):
    """CREDIT's NextGenWXFormer with Linear projections; state-dict keys are CREDIT's."""

    input_layout = "credit"  # (B, C, T, H, W) in, (B, C_out, 1, H, W) out
    _shard_units = ("layers.0", "layers.1", "layers.2", "layers.3", "spectral_bottleneck", "up_block1", "up_block2", "up_block3", "up_block4")

    def __init__(self, spec: CreditSpec, *, col_attn_heads: int = 4, col_attn_stride: int = 1,
                 decoder_col_attn: bool = False, num_spectral_nodes: int = 64, gemm: str = "fast") -> None:
        super().__init__()
        check_decoder_widths(spec.dim)
        try:
            check_windows(spec.grid, spec.cross_embed_strides, spec.local_window_size, spec.global_window_size,
                          "the grid")
        except ValueError as error:  # CREDIT's nextgen_wxformer pads nothing: say what grid would do
            multiple = stage_multiple(spec.cross_embed_strides, spec.local_window_size, spec.global_window_size)
            raise ValueError(f"{error}; nextgen_wxformer pads nothing, so with these strides and windows the grid "
                             f"must divide by {multiple} (or use model=wxformer with "
                             f"model.padding_conf)") from None
        if col_attn_stride < 1 or spec.image_height % col_attn_stride or spec.image_width % col_attn_stride:
            raise ValueError(f"model.col_attn_stride={col_attn_stride} must be >= 1 and divide the grid "
                             f"{spec.image_height}x{spec.image_width}")
        self.spec, self.deterministic = spec, gemm == "deterministic"
        self.level_embedding = LevelEmbedding(spec.channels, spec.levels, gemm == "deterministic")
        self.col_attn = ColumnAttention(spec.channels, spec.levels, col_attn_heads, col_attn_stride, gemm)
        self.layers = build_encoder(spec, spec.frame_channels * spec.frames, gemm, spec.grid)
        bottom = encoder_grids(spec.grid, spec.cross_embed_strides)[-1]
        last = spec.dim[-1]
        self.spectral_bottleneck = SpectralGNNBottleneck(last, bottom[0] * bottom[1], num_spectral_nodes,
                                                         gemm=gemm)
        self.up_block1 = UpBlockPS(last, last // 2, spec.dim[0], gemm=gemm)
        self.up_block2 = UpBlockPS(last, last // 4, spec.dim[0], gemm=gemm)
        self.up_block3 = UpBlockPS(last // 2, last // 8, spec.dim[0], gemm=gemm)
        self.up_block4 = output_head(last // 4, spec.output_channels, icnr=False, gemm=gemm)
        self.dec_col_attn = (ColumnAttention(spec.channels, spec.levels, col_attn_heads, col_attn_stride, gemm)
                             if decoder_col_attn else None)
        number_dropouts(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        spec.check_input(x, "nextgen_wxformer")
        frames = x.transpose(1, 2)  # (B, T, C, H, W): time-major
        per_frame, out_ch = spec.frame_channels, spec.output_channels
        # the residual base: CREDIT takes out_ch channels from the start of the last frame
        # (zeros beyond the frame's end)
        base = frames[:, -1, :out_ch]
        if base.shape[1] < out_ch:
            base = F.pad(base, (0, 0, 0, 0, 0, out_ch - base.shape[1]))
        atmos = spec.channels * spec.levels
        b, t = frames.shape[:2]
        # every frame's atmosphere in one call, frames of a sample adjacent (sample-major rows)
        embedded = self.col_attn(self.level_embedding(frames[:, :, :atmos].reshape(b * t, atmos, *spec.grid)))
        x = torch.cat([embedded.view(b, t, atmos, *spec.grid), frames[:, :, atmos:per_frame]], dim=2).flatten(1, 2)
        encodings = []
        for embed, transformer in self.layers:
            x = transformer(embed(x))
            encodings.append(x)
        x = self.spectral_bottleneck(x)
        for up, skip in ((self.up_block1, encodings[2]), (self.up_block2, encodings[1]),
                         (self.up_block3, encodings[0])):
            x = torch.cat([resize(up(x), skip.shape[-2:], self.deterministic), skip], dim=1)
        x = resize(self.up_block4(x), spec.grid, self.deterministic)
        if self.dec_col_attn is not None:
            x = torch.cat([self.dec_col_attn(x[:, :atmos]), x[:, atmos:]], dim=1)
        # a fresh tensor, not a view: FSDP2's pre-backward hook on a wrapped root's output
        # would be lost to an in-place op on a view
        return (x + base).unsqueeze(2).clone()
