"""The windowformer: this project's own compact cross-scale window transformer that steps an
atmospheric state 6 h ahead. It is not one of CREDIT's architectures (those are
`crossformer.py` and `wxformer_next.py`, the default): its stage widths need not double, its
decoder is transposed convolutions, and its input is (B, C, H, W). It stays as the small,
quick model of the multi-rank tests, the SDC probe and the benchmarks (`model=windowformer`).

Read top to bottom: the blocks that tensor parallelism shards (Attention, FeedForward,
each declaring its `_tp_plan` beside it), the transformer stage that alternates local
and dilated-window attention, the cross-embedding and up-sampling layers, and the
model that strings them into an encoder/decoder with skip connections and a residual
output.

Layout of the model's input `x` (B, C_in, H, W), channels in this order:
  history_len frames of the prognostic state (each `n_state` channels),
  the dynamic forcing channels, then the static channels.
Output (B, n_state + n_diagnostic, H, W): the next prognostic state (last input frame +
predicted change) followed by the diagnostic channels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from credit.models.dropout import IndexedDropout
from credit.models.fanout import fan_out
from credit.models.layer_kit import layer_kit, shard_of
from credit.models.padding import EarthPad, required_multiple
from credit.models.windows import check_head_split, from_windows, residual_rounds, to_windows


@dataclass(frozen=True)
class WindowFormerSpec:
    """Everything that shapes the network. Built from `model.*` and the data layout."""

    in_channels: int
    out_channels: int
    state_channels: int  # prognostic channels per frame, also the residual's width
    history_len: int
    grid: tuple[int, int]
    dim: tuple[int, ...]
    depth: tuple[int, ...]
    dim_head: int
    local_window_size: tuple[int, ...]
    global_window_size: tuple[int, ...]
    cross_embed_kernel_sizes: tuple[tuple[int, ...], ...]
    cross_embed_strides: tuple[int, ...]
    ff_mult: int = 4
    attn_dropout: float = 0.0
    ff_dropout: float = 0.0
    padding: str = "earth"
    gemm: str = "fast"  # fast | deterministic (see docs/determinism.md)


class Attention(nn.Module):
    """Multi-head self-attention inside windows of a channels-last (B, H, W, C) grid.

    `kind="local"` attends within contiguous window x window patches; `kind="global"`
    attends among points spaced H/window (and W/window) apart, so information crosses
    the whole grid. The head count is read from the width of `to_q`'s output, so a
    tensor-parallel rank that holds half of q's columns runs half of the heads.
    """

    # colwise: output features split across tp ranks (whole heads per rank, since
    # q/k/v are separate and heads are contiguous); rowwise: input features split,
    # partial outputs summed across tp ranks.
    _tp_plan = {"to_q": "colwise", "to_k": "colwise", "to_v": "colwise", "to_out": "rowwise"}

    def __init__(self, dim: int, dim_head: int, window: int, kind: str, dropout: float,
                 gemm: str = "fast") -> None:
        super().__init__()
        kit = layer_kit(gemm)
        inner = self._init_windows(dim, dim_head, window, kind, dropout, kit.layer_norm)
        linear = kit.linear
        self.to_q = linear(dim, inner, bias=False)
        self.to_k = linear(dim, inner, bias=False)
        self.to_v = linear(dim, inner, bias=False)
        self.to_out = linear(inner, dim)
        # Deterministic mode spells attention out (fixed products, indexed dropout mask).
        if gemm == "deterministic":
            self.indexed_dropout = IndexedDropout(dropout)

    def _init_windows(self, dim: int, dim_head: int, window: int, kind: str, dropout: float,
                      layer_norm: type[nn.LayerNorm] = nn.LayerNorm) -> int:
        """Everything but the projections (shared with the legacy layout); returns the
        projections' inner width, whole heads of `dim_head`."""
        if kind not in ("local", "global"):
            raise ValueError(f"attention kind {kind!r} is not 'local' or 'global'")
        self.dim_head = dim_head
        self.window = window
        self.kind = kind
        self.dropout = dropout
        self.indexed_dropout: IndexedDropout | None = None  # deterministic mode sets it
        self.norm = layer_norm(dim)
        return (dim // dim_head) * dim_head

    @staticmethod
    def _tp_constraints(module: "Attention", tp_size: int) -> None:
        check_head_split(module.to_q.out_features // module.dim_head, module.dim_head, tp_size)

    def _to_windows(self, x: torch.Tensor) -> torch.Tensor:
        return to_windows(x, self.window, dilated=self.kind != "local")

    def _from_windows(self, x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return from_windows(x, shape, self.window, dilated=self.kind != "local")

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(windows, length, width) q/k/v -> attended values, heads = width // dim_head."""
        n, length, width = q.shape
        heads = width // self.dim_head

        def split_heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(n, length, heads, self.dim_head).transpose(1, 2)

        if self.indexed_dropout is not None:
            attended = self._attend_deterministic(*(split_heads(t).contiguous() for t in (q, k, v)))
            return attended.transpose(1, 2).reshape(n, length, width)
        attended = F.scaled_dot_product_attention(
            split_heads(q),
            split_heads(k),
            split_heads(v),
            dropout_p=self.dropout if self.training else 0.0,
        )
        return attended.transpose(1, 2).reshape(n, length, width)

    def _attend_deterministic(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q kᵀ / sqrt(d)) v per (window, head), each head's products computed alone
        (contiguous per-head operands, so nothing depends on how many heads a rank holds), and
        dropout indexed by (global window, query, key, global head)."""
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.dim_head))
        probs = torch.softmax(scores, dim=-1)
        if self.training and self.indexed_dropout.p > 0.0:
            n, heads, length, _ = probs.shape
            head_offset, global_width = shard_of(self.to_q.weight)
            mask = self.indexed_dropout(
                torch.ones((n, length * length, heads), dtype=probs.dtype, device=probs.device),
                col_offset=head_offset // self.dim_head, global_cols=global_width // self.dim_head,
            )
            probs = probs * mask.view(n, length, length, heads).permute(0, 3, 1, 2)
        return torch.matmul(probs, v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.indexed_dropout is not None:
            # Deterministic mode projects per sample before windowing (each sample's rows stay
            # together for the row tree) and adds the q, k, v input gradients in order.
            for_q, for_k, for_v = fan_out(self.norm(x), 3)
            q, k, v = (self._to_windows(proj(t)) for proj, t in
                       ((self.to_q, for_q), (self.to_k, for_k), (self.to_v, for_v)))
            merged = self._from_windows(self._attend(q, k, v), (*x.shape[:-1], q.shape[-1]))
            return self.to_out(merged)
        windows = self._to_windows(self.norm(x))
        merged = self._attend(self.to_q(windows), self.to_k(windows), self.to_v(windows))
        return self._from_windows(self.to_out(merged), x.shape)


class FeedForward(nn.Module):
    """Pre-norm two-layer MLP over channels of a channels-last grid."""

    # colwise: hidden features split across tp ranks; rowwise: partial outputs summed.
    _tp_plan = {"up": "colwise", "down": "rowwise"}

    def __init__(self, dim: int, mult: int, dropout: float, gemm: str = "fast") -> None:
        super().__init__()
        kit = layer_kit(gemm)
        linear = kit.linear
        self.norm = kit.layer_norm(dim)
        self.act = kit.gelu()
        self.up = linear(dim, dim * mult)
        self.down = linear(dim * mult, dim)
        self.dropout = IndexedDropout(dropout) if gemm == "deterministic" else nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.act(self.up(self.norm(x)))
        if isinstance(self.dropout, IndexedDropout):
            offset, width = shard_of(self.up.weight)
            return self.down(self.dropout(hidden, col_offset=offset, global_cols=width))
        return self.down(self.dropout(hidden))


class TransformerStage(nn.Module):
    """`depth` rounds of local attention, feed-forward, global attention, feed-forward."""

    def __init__(
        self,
        dim: int,
        depth: int,
        dim_head: int,
        local_window: int,
        global_window: int,
        ff_mult: int,
        attn_dropout: float,
        ff_dropout: float,
        gemm: str = "fast",
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList()
        for _ in range(depth):
            self.layers.append(
                nn.ModuleList(
                    [
                        Attention(dim, dim_head, local_window, "local", attn_dropout, gemm),
                        FeedForward(dim, ff_mult, ff_dropout, gemm),
                        Attention(dim, dim_head, global_window, "global", attn_dropout, gemm),
                        FeedForward(dim, ff_mult, ff_dropout, gemm),
                    ]
                )
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return residual_rounds(x, self.layers)


class CrossEmbed(nn.Module):
    """Strided convolutions of several kernel sizes, concatenated along channels.

    Small kernels get more channels than large ones; all share the stride, so their
    outputs line up on the downsampled grid.
    """

    def __init__(self, dim_in: int, dim_out: int, kernel_sizes: tuple[int, ...], stride: int,
                 gemm: str = "fast"):
        super().__init__()
        self.ordered_fan_out = gemm == "deterministic"
        conv = layer_kit(gemm).conv
        kernels = sorted(kernel_sizes)
        widths = [dim_out // 2 ** (i + 1) for i in range(len(kernels) - 1)]
        widths.append(dim_out - sum(widths))
        self.convs = nn.ModuleList(
            conv(dim_in, width, k, stride=stride, padding=(k - stride) // 2)
            for k, width in zip(kernels, widths)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inputs = fan_out(x, len(self.convs)) if self.ordered_fan_out else [x] * len(self.convs)
        return torch.cat([conv(xi) for conv, xi in zip(self.convs, inputs)], dim=1)


def _group_norm(channels: int, kit: SimpleNamespace) -> nn.GroupNorm:
    return kit.group_norm(math.gcd(channels, 8), channels)


class UpBlock(nn.Module):
    """Transposed-convolution upsampling followed by a residual 3x3 convolution."""

    def __init__(self, dim_in: int, dim_out: int, scale: int, gemm: str = "fast") -> None:
        super().__init__()
        kit = layer_kit(gemm)
        self.up = kit.conv_transpose(dim_in, dim_out, kernel_size=scale, stride=scale)
        self.norm = _group_norm(dim_out, kit)
        self.conv = kit.conv(dim_out, dim_out, 3, padding=1)
        self.conv_norm = _group_norm(dim_out, kit)
        self.act = kit.silu()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm(self.up(x)))
        return x + self.act(self.conv_norm(self.conv(x)))


class WindowFormer(nn.Module):
    """Encoder of cross-embedding + transformer stages, decoder with skips, residual output."""

    # the units data parallelism wraps one by one (a container's children, or a module)
    _shard_units = ("embeds", "stages", "ups", "head")

    def __init__(self, spec: WindowFormerSpec) -> None:
        super().__init__()
        self.spec = spec
        windows = [
            [lw, gw] for lw, gw in zip(spec.local_window_size, spec.global_window_size)
        ]
        self.pad = EarthPad(
            spec.grid, required_multiple(list(spec.cross_embed_strides), windows), spec.padding
        )
        dims_in = (spec.in_channels, *spec.dim[:-1])
        self.embeds = nn.ModuleList()
        self.stages = nn.ModuleList()
        for i, (d_in, d_out) in enumerate(zip(dims_in, spec.dim)):
            self.embeds.append(
                CrossEmbed(d_in, d_out, spec.cross_embed_kernel_sizes[i], spec.cross_embed_strides[i],
                           spec.gemm)
            )
            self.stages.append(
                TransformerStage(
                    d_out,
                    spec.depth[i],
                    spec.dim_head,
                    spec.local_window_size[i],
                    spec.global_window_size[i],
                    spec.ff_mult,
                    spec.attn_dropout,
                    spec.ff_dropout,
                    spec.gemm,
                )
            )
        # decoder: stage i's output is upsampled to stage i-1's grid and concatenated
        # with stage i-1's output (skip connection), hence the doubled widths.
        self.ups = nn.ModuleList()
        width = spec.dim[-1]
        for i in range(len(spec.dim) - 1, 0, -1):
            self.ups.append(UpBlock(width, spec.dim[i - 1], spec.cross_embed_strides[i], spec.gemm))
            width = 2 * spec.dim[i - 1]
        self.head = layer_kit(spec.gemm).conv_transpose(
            width,
            spec.out_channels,
            kernel_size=spec.cross_embed_strides[0],
            stride=spec.cross_embed_strides[0],
        )
        # Start close to persistence: a small predicted change at initialisation.
        with torch.no_grad():
            self.head.weight.mul_(0.1)
            self.head.bias.zero_()
        # Each indexed dropout draws its own stream: number them in module order.
        for layer, module in enumerate(m for m in self.modules() if isinstance(m, IndexedDropout)):
            module.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        if x.shape[1] != spec.in_channels or tuple(x.shape[-2:]) != spec.grid:
            raise ValueError(
                f"windowformer expects input (B, {spec.in_channels}, {spec.grid[0]}, "
                f"{spec.grid[1]}), got {tuple(x.shape)}"
            )
        start = (spec.history_len - 1) * spec.state_channels
        last_state = x[:, start : start + spec.state_channels]

        h = self.pad(x)
        skips = []
        for embed, stage in zip(self.embeds, self.stages):
            h = stage(embed(h))
            skips.append(h)
        for up, skip in zip(self.ups, reversed(skips[:-1])):
            h = torch.cat([up(h), skip], dim=1)
        out = self.pad.crop(self.head(h))

        delta, diagnostic = out[:, : spec.state_channels], out[:, spec.state_channels :]
        return torch.cat([last_state + delta, diagnostic], dim=1)
