"""CREDIT's `wxformer_next`: the crossformer encoder/decoder plus a learned per-level
embedding and column attention across pressure levels at the input, a spectral-GNN
bottleneck between encoder and decoder, optional column attention on the output, and a
residual output (last input frame + predicted change).

CREDIT's layout in and out, as `crossformer`, except that frames fold time-major
((B, C, T) -> (B, T·C)), as CREDIT's class does. No boundary padding: the grid must tile.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from credit.models.credit_layers import UpBlockPS, check_windows, encoder_grids, output_head, resize
from credit.models.crossformer import CreditSpec, build_encoder, check_decoder_widths


class LevelEmbedding(nn.Module):
    """A learned bias per (variable, level) channel of the atmospheric input."""

    def __init__(self, channels: int, levels: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(channels * levels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias[None, :, None, None]


class PackedAttention(nn.Module):
    """Self-attention with one packed (3C, C) input projection and no biases: the
    parameters (`in_proj_weight`, `out_proj.weight`) and arithmetic of
    `nn.MultiheadAttention(C, heads, bias=False, batch_first=True)`."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"model.col_attn_heads={heads} must divide model.channels={dim}")
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        nn.init.xavier_uniform_(self.in_proj_weight)
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length, dim = x.shape
        q, k, v = F.linear(x, self.in_proj_weight).chunk(3, dim=-1)
        q, k, v = (t.reshape(n, length, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(attended.transpose(1, 2).reshape(n, length, dim))


class ColumnAttention(nn.Module):
    """Attention across the pressure levels of each grid column, on the atmospheric
    channels (variable-major, level-minor); optionally on a grid average-pooled by
    `spatial_stride`, the correction resized back bilinearly."""

    def __init__(self, channels: int, levels: int, num_heads: int, spatial_stride: int) -> None:
        super().__init__()
        self.channels, self.levels, self.spatial_stride = channels, levels, spatial_stride
        self.norm = nn.LayerNorm(channels)
        self.attn = PackedAttention(channels, num_heads)
        self.proj = nn.Linear(channels, channels, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, height, width = x.shape
        pooled = F.avg_pool2d(x, self.spatial_stride) if self.spatial_stride > 1 else x
        h, w = pooled.shape[-2:]
        columns = pooled.reshape(b, self.channels, self.levels, h, w).permute(0, 3, 4, 2, 1)
        columns = columns.reshape(b * h * w, self.levels, self.channels)
        delta = self.proj(self.attn(self.norm(columns)))
        delta = delta.reshape(b, h, w, self.levels, self.channels).permute(0, 4, 3, 1, 2).reshape(b, c, h, w)
        return x + resize(delta, (height, width))


class SpectralGNNBottleneck(nn.Module):
    """Pools the N grid nodes onto K learned virtual nodes (`agg_w`), mixes channels
    there with an MLP, scatters the correction back (`scatter_w`): O(N·K) global mixing."""

    # the channel MLP at the K nodes is a feed-forward: hidden features split across tp ranks
    _tp_plan = {"mlp.0": "colwise", "mlp.2": "rowwise"}

    def __init__(self, dim: int, nodes: int, num_spectral_nodes: int, mlp_ratio: float = 2.0) -> None:
        super().__init__()
        hidden = max(1, int(dim * mlp_ratio))
        self.norm = nn.GroupNorm(1, dim)
        self.agg_w = nn.Parameter(torch.randn(num_spectral_nodes, nodes) * nodes ** -0.5)
        self.scatter_w = nn.Parameter(torch.randn(nodes, num_spectral_nodes) * num_spectral_nodes ** -0.5)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        flat = self.norm(x).reshape(b, c, h * w)
        spectral = F.linear(flat, self.agg_w)  # (B, C, K)
        mixed = self.mlp(spectral.transpose(1, 2)).transpose(1, 2)
        delta = F.linear(mixed, self.scatter_w)  # (B, C, N)
        return x + delta.reshape(b, c, h, w)


class WXFormerNext(nn.Module):
    """CREDIT's NextGenWXFormer with Linear projections; state-dict keys are CREDIT's."""

    input_layout = "credit"  # (B, C, T, H, W) in, (B, C_out, 1, H, W) out
    _shard_units = ("layers.0", "layers.1", "layers.2", "layers.3", "spectral_bottleneck", "up_block1", "up_block2", "up_block3", "up_block4")

    def __init__(self, spec: CreditSpec, *, col_attn_heads: int = 4, col_attn_stride: int = 1,
                 decoder_col_attn: bool = False, num_spectral_nodes: int = 64) -> None:
        super().__init__()
        check_decoder_widths(spec.dim)
        check_windows(spec.grid, spec.cross_embed_strides, spec.local_window_size, spec.global_window_size,
                      "the grid")
        if col_attn_stride < 1 or spec.image_height % col_attn_stride or spec.image_width % col_attn_stride:
            raise ValueError(f"model.col_attn_stride={col_attn_stride} must be >= 1 and divide the grid "
                             f"{spec.image_height}x{spec.image_width}")
        self.spec = spec
        self.level_embedding = LevelEmbedding(spec.channels, spec.levels)
        self.col_attn = ColumnAttention(spec.channels, spec.levels, col_attn_heads, col_attn_stride)
        self.layers = build_encoder(spec, spec.frame_channels * spec.frames)
        bottom = encoder_grids(spec.grid, spec.cross_embed_strides)[-1]
        last = spec.dim[-1]
        self.spectral_bottleneck = SpectralGNNBottleneck(last, bottom[0] * bottom[1], num_spectral_nodes)
        self.up_block1 = UpBlockPS(last, last // 2, spec.dim[0])
        self.up_block2 = UpBlockPS(last, last // 4, spec.dim[0])
        self.up_block3 = UpBlockPS(last // 2, last // 8, spec.dim[0])
        self.up_block4 = output_head(last // 4, spec.output_channels, icnr=False)
        self.dec_col_attn = (ColumnAttention(spec.channels, spec.levels, col_attn_heads, col_attn_stride)
                             if decoder_col_attn else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        spec.check_input(x, "wxformer_next")
        frames = x.transpose(1, 2)  # (B, T, C, H, W): time-major
        per_frame, out_ch = spec.frame_channels, spec.output_channels
        # the residual base: CREDIT takes out_ch channels from the start of the last frame
        # (zeros beyond the frame's end)
        base = frames[:, -1, :out_ch]
        if base.shape[1] < out_ch:
            base = F.pad(base, (0, 0, 0, 0, 0, out_ch - base.shape[1]))
        atmos = spec.channels * spec.levels
        parts = []
        for t in range(spec.frames):
            parts += [self.col_attn(self.level_embedding(frames[:, t, :atmos])), frames[:, t, atmos:per_frame]]
        x = torch.cat(parts, dim=1)
        encodings = []
        for embed, transformer in self.layers:
            x = transformer(embed(x))
            encodings.append(x)
        x = self.spectral_bottleneck(x)
        for up, skip in ((self.up_block1, encodings[2]), (self.up_block2, encodings[1]),
                         (self.up_block3, encodings[0])):
            x = torch.cat([resize(up(x), skip.shape[-2:]), skip], dim=1)
        x = resize(self.up_block4(x), spec.grid)
        if self.dec_col_attn is not None:
            x = torch.cat([self.dec_col_attn(x[:, :atmos]), x[:, atmos:]], dim=1)
        # a fresh tensor, not a view: FSDP2's pre-backward hook on a wrapped root's output
        # would be lost to an in-place op on a view
        return (x + base).unsqueeze(2).clone()
