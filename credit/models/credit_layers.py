"""The building blocks of CREDIT's `crossformer` and `wxformer_next`, with CREDIT's
state-dict keys and arithmetic.

Every projection is an `nn.Linear` over channels-last tokens (CREDIT's newest layout; its
older 1x1 convolutions load through `credit.models.credit_checkpoint`), and each
tensor-parallel block declares its `_tp_plan` beside it. A transformer stage permutes to
channels-last once and back once, so the channel LayerNorm (`norm.g`, `norm.b`, shaped
(1, C, 1, 1) as CREDIT stores them) runs as `F.layer_norm` over the last dimension.

`gemm="deterministic"` builds the same parameters with the fixed-tree layers of
`credit.models.modes.layer_kit` and the written-out attention of `credit.models.credit_det`
(see docs/determinism.md).
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from credit.kernels.gemm import det_linear
from credit.kernels.gemm._dtensor import tree_all_reduce_grad
from credit.models.credit_det import windowed_attention
from credit.models.det_layers import channel_affine
from credit.models.dropout import IndexedDropout
from credit.models.fanout import fan_out
from credit.models.modes import layer_kit, shard_of
from credit.models.windows import check_head_split, from_windows, residual_rounds, to_windows
from credit.parallel.sequence import (all_reduce_sum, gather_rows, gather_rows_partial, halo_rows, own_rows,
                                      saving_rows_only)


class ChannelLayerNorm(nn.Module):
    """LayerNorm over channels with CREDIT's parameter names and shapes, applied to a
    channels-last tensor (..., C).

    `sequence_group`: the tp group when `x` holds this rank's rows only (sequence
    parallelism), so the affine gradients are partial sums over rows. Deterministic mode
    adds them across the group inside the backward, per sample, in one process's tree; fast
    mode leaves them to the one reduction after backward (the block declares them in
    `sequence_partial_parameters`)."""

    def __init__(self, dim: int, eps: float = 1e-5, deterministic: bool = False) -> None:
        super().__init__()
        self.eps, self.deterministic = eps, deterministic
        self.g = nn.Parameter(torch.ones(1, dim, 1, 1))
        self.b = nn.Parameter(torch.zeros(1, dim, 1, 1))

    def forward(self, x: torch.Tensor, sequence_group: dist.ProcessGroup | None = None) -> torch.Tensor:
        c = x.shape[-1]
        g, b = self.g.reshape(c), self.b.reshape(c)
        if self.deterministic:  # per-row normalisation, affine gradients by the row tree
            return channel_affine(F.layer_norm(x, (c,), None, None, self.eps), g, b, sequence_group)
        return F.layer_norm(x, (c,), g, b, self.eps)


class DynamicPositionBias(nn.Module):
    """An MLP from a relative (dy, dx) offset to one attention bias, shared by all heads."""

    def __init__(self, dim: int, gemm: str = "fast") -> None:
        super().__init__()
        kit = layer_kit(gemm)
        self.layers = nn.Sequential(
            kit.linear(2, dim), kit.layer_norm(dim), nn.ReLU(),
            kit.linear(dim, dim), kit.layer_norm(dim), nn.ReLU(),
            kit.linear(dim, dim), kit.layer_norm(dim), nn.ReLU(),
            kit.linear(dim, 1),
        )

    def forward(self, offsets: torch.Tensor) -> torch.Tensor:
        return self.layers(offsets).squeeze(-1)


def relative_bias_indices(window: int) -> torch.Tensor:
    """(window², window²) indices into the bias table of `DynamicPositionBias`.

    CREDIT evaluates the MLP on the (2w+1)² offsets -w..w but indexes that table with a row
    length of 2w-1; kept as it is, because trained checkpoints depend on it.
    """
    pos = torch.arange(window)
    grid = torch.stack(torch.meshgrid(pos, pos, indexing="ij")).flatten(1).t()  # (w², 2)
    rel = grid[:, None] - grid[None, :] + (window - 1)
    return rel[..., 0] * (2 * window - 1) + rel[..., 1]


class Attention(nn.Module):
    """Multi-head attention inside windows of a channels-last (B, H, W, C) grid.

    `attn_type="short"` attends within contiguous window×window patches; `"long"` among
    points H/window (and W/window) apart. A dynamic position bias is added to the scores.
    The head count is read from `to_q`'s local output width, so a tensor-parallel rank
    holding some of the heads runs just those.

    Under sequence parallelism (`sequence_mesh` set by `credit.parallel.sequence`) `x` is
    this rank's rows: a sharded block normalises them, gathers the grid once for its
    heads' q/k/v and leaves `to_out` through a reduce-scatter of rows (its plan's rowwise
    output is then `Shard(1)`); a block kept whole gathers, runs whole and keeps its rows.
    """

    # colwise: output features split by whole heads (q, k, v are separate Linears);
    # rowwise: input features split, partial outputs summed across tp ranks.
    _tp_plan = {"to_q": "colwise", "to_k": "colwise", "to_v": "colwise", "to_out": "rowwise"}
    sequence_mesh: DeviceMesh | None = None
    sequence_regather = False  # keep only this rank's rows of the gathered input for backward

    def __init__(self, dim: int, attn_type: str, window_size: int, dim_head: int,
                 dropout: float, gemm: str = "fast") -> None:
        super().__init__()
        if attn_type not in ("short", "long"):
            raise ValueError(f"attention type {attn_type!r} is not 'short' or 'long'")
        heads = dim // dim_head
        inner = heads * dim_head
        self.heads, self.dim_head = heads, dim_head
        self.attn_type, self.window_size, self.dropout = attn_type, window_size, dropout
        linear = layer_kit(gemm).linear
        self.norm = ChannelLayerNorm(dim, deterministic=gemm == "deterministic")
        self.to_q = linear(dim, inner, bias=False)
        self.to_k = linear(dim, inner, bias=False)
        self.to_v = linear(dim, inner, bias=False)
        self.to_out = linear(inner, dim)
        self.dpb = DynamicPositionBias(dim // 4, gemm)
        # deterministic mode: the attention written out, its dropout indexed by global head
        self.indexed_dropout = IndexedDropout(dropout) if gemm == "deterministic" else None
        pos = torch.arange(-window_size, window_size + 1, dtype=torch.float32)
        offsets = torch.stack(torch.meshgrid(pos, pos, indexing="ij")).flatten(1).t()
        self.register_buffer("rel_offsets", offsets, persistent=False)
        self.register_buffer("rel_pos_indices", relative_bias_indices(window_size), persistent=False)

    @staticmethod
    def _tp_constraints(module: "Attention", tp_size: int) -> None:
        check_head_split(module.heads, module.dim_head, tp_size)

    def _to_windows(self, x: torch.Tensor) -> torch.Tensor:
        return to_windows(x, self.window_size, dilated=self.attn_type != "short")

    def _from_windows(self, x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return from_windows(x, shape, self.window_size, dilated=self.attn_type != "short")

    def position_bias(self, dtype: torch.dtype) -> torch.Tensor:
        """(window², window²) bias added to every head's scores.

        Under tensor parallelism a rank adds it to its own heads only, so its gradient there
        is a partial sum over heads: the ranks' partials are added (fixed tree, rank order)
        before they reach the position-bias MLP, whose weights every tp rank holds whole."""
        bias = self.dpb(self.rel_offsets.to(dtype))[self.rel_pos_indices]
        if isinstance(self.to_q.weight, DTensor):
            bias = tree_all_reduce_grad(bias, self.to_q.weight.device_mesh.get_group())
        return bias

    def _forward_deterministic(self, x: torch.Tensor, sequence_mesh: DeviceMesh | None = None) -> torch.Tensor:
        """Projections per sample before windowing (each sample's rows stay together for the
        row tree), q/k/v input gradients added in order, the bias computed per sample.
        `sequence_mesh`: `x` is this rank's rows; the q/k/v layers tree-sum their input
        gradients across ranks, so the gather's backward just keeps this rank's rows."""
        rows = self.norm(x, sequence_mesh.get_group()) if sequence_mesh is not None else self.norm(x)
        x = gather_rows(rows, sequence_mesh) if sequence_mesh is not None else rows
        with self._saving_rows(rows, x):
            for_q, for_k, for_v = fan_out(x, 3)
            q, k, v = (self._to_windows(proj(t)) for proj, t in
                       ((self.to_q, for_q), (self.to_k, for_k), (self.to_v, for_v)))
        batch = x.shape[0]
        table = self.dpb(self.rel_offsets.to(q.dtype).expand(batch, -1, -1).contiguous())
        weight = self.to_q.weight
        head_offset, global_width = shard_of(weight)
        attended = windowed_attention(
            q, k, v, gather_position_bias(table, self.window_size), dim_head=self.dim_head,
            dropout=self.indexed_dropout, training=self.training, head_offset=head_offset // self.dim_head,
            global_heads=global_width // self.dim_head,
            group=weight.device_mesh.get_group() if isinstance(weight, DTensor) else None,
        )
        return self.to_out(self._from_windows(attended, (*x.shape[:-1], q.shape[-1])))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mesh = self.sequence_mesh
        if mesh is not None and not isinstance(self.to_q.weight, DTensor):  # kept whole on every tp rank
            return own_rows(self._forward_whole(gather_rows(x, mesh)), mesh)
        if mesh is None:
            return self._forward_whole(x)
        if self.indexed_dropout is not None:
            return self._forward_deterministic(x, mesh)
        rows = self.norm(x, mesh.get_group())
        full = gather_rows_partial(rows, mesh)
        with self._saving_rows(rows, full):
            q, k, v = self.to_q(full), self.to_k(full), self.to_v(full)  # this rank's heads, every row
        grid = q.shape
        attended = self._attend(self._to_windows(q), self._to_windows(k), self._to_windows(v))
        return self.to_out(self._from_windows(attended, grid))  # reduce-scattered to this rank's rows

    def sequence_partial_parameters(self) -> list[str]:
        """The norm's affine, when this block normalises only this rank's rows (fast mode)."""
        on_rows = self.sequence_mesh is not None and isinstance(self.to_q.weight, DTensor)
        return ["norm.g", "norm.b"] if on_rows and not self.norm.deterministic else []

    def _saving_rows(self, rows: torch.Tensor, full: torch.Tensor):
        if self.sequence_mesh is not None and self.sequence_regather and rows is not full:
            return saving_rows_only(rows, full, self.sequence_mesh)
        return contextlib.nullcontext()

    def _forward_whole(self, x: torch.Tensor) -> torch.Tensor:
        if self.indexed_dropout is not None:
            return self._forward_deterministic(x)
        windows = self._to_windows(self.norm(x))
        merged = self._attend(self.to_q(windows), self.to_k(windows), self.to_v(windows))
        return self._from_windows(self.to_out(merged), x.shape)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Windowed q, k, v (windows, length, heads · dim_head) to the heads' outputs, merged."""
        n, length, width = q.shape
        heads = width // self.dim_head

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(n, length, heads, self.dim_head).transpose(1, 2)

        attended = F.scaled_dot_product_attention(
            split(q), split(k), split(v), attn_mask=self.position_bias(q.dtype),
            dropout_p=self.dropout if self.training else 0.0, scale=self.dim_head ** -0.5,
        )
        return attended.transpose(1, 2).reshape(n, length, width)


class FeedForward(nn.Module):
    """Pre-norm channel MLP; CREDIT's keys `layers.0` (norm), `layers.1`, `layers.4`."""

    # colwise: hidden features split across tp ranks; rowwise: partial outputs summed.
    _tp_plan = {"layers.1": "colwise", "layers.4": "rowwise"}
    sequence_mesh: DeviceMesh | None = None  # as Attention's
    sequence_regather = False

    def __init__(self, dim: int, mult: int = 4, dropout: float = 0.0, gemm: str = "fast") -> None:
        super().__init__()
        deterministic = gemm == "deterministic"
        linear = layer_kit(gemm).linear
        self.layers = nn.Sequential(
            ChannelLayerNorm(dim, deterministic=deterministic), linear(dim, dim * mult), nn.GELU(),
            IndexedDropout(dropout) if deterministic else nn.Dropout(dropout), linear(dim * mult, dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm, up, act, dropout, down = self.layers
        mesh = self.sequence_mesh
        if mesh is not None and not isinstance(up.weight, DTensor):  # kept whole on every tp rank
            return own_rows(self._hidden_to_out(norm(gather_rows(x, mesh))), mesh)
        if mesh is None:
            return self._hidden_to_out(norm(x))
        normed = norm(x, mesh.get_group())  # this rank's rows, gathered for the hidden columns
        gathered = gather_rows(normed, mesh) if norm.deterministic else gather_rows_partial(normed, mesh)
        if not self.sequence_regather:
            return self._hidden_to_out(gathered)  # reduce-scattered to this rank's rows
        with saving_rows_only(normed, gathered, mesh):
            hidden = up(gathered)
        return self._hidden_to_out(hidden, up_done=True)

    def sequence_partial_parameters(self) -> list[str]:
        """The norm's affine, when this block normalises only this rank's rows (fast mode)."""
        norm, up = self.layers[0], self.layers[1]
        on_rows = self.sequence_mesh is not None and isinstance(up.weight, DTensor)
        return ["layers.0.g", "layers.0.b"] if on_rows and not norm.deterministic else []

    def _hidden_to_out(self, normed: torch.Tensor, up_done: bool = False) -> torch.Tensor:
        _, up, act, dropout, down = self.layers
        hidden = normed if up_done else up(normed)
        if isinstance(dropout, IndexedDropout):  # masks indexed by global hidden column
            offset, width = shard_of(up.weight)
            return down(dropout(act(hidden), col_offset=offset, global_cols=width))
        return down(dropout(act(hidden)))


class Transformer(nn.Module):
    """`depth` rounds of short attention, feed-forward, long attention, feed-forward,
    each residual, on a (B, C, H, W) grid."""

    sequence_mesh: DeviceMesh | None = None  # set by credit.parallel.sequence: x's rows split over it
    sequence_rows_through = False  # the whole model runs on rows: x comes in and leaves as rows
    _sequence_grid: tuple[int, int] | None = None  # the (H, W) this stage works on, set by the model

    def __init__(self, dim: int, *, local_window_size: int, global_window_size: int, depth: int,
                 dim_head: int, attn_dropout: float, ff_dropout: float, gemm: str = "fast") -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.ModuleList([
                Attention(dim, "short", local_window_size, dim_head, attn_dropout, gemm),
                FeedForward(dim, dropout=ff_dropout, gemm=gemm),
                Attention(dim, "long", global_window_size, dim_head, attn_dropout, gemm),
                FeedForward(dim, dropout=ff_dropout, gemm=gemm),
            ])
            for _ in range(depth)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return residual_rounds(x, self.layers, self.sequence_mesh, self.sequence_rows_through)


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
            stack += [kit.conv(out_ch, out_ch, 3, padding=1), kit.group_norm(num_groups, out_ch), nn.SiLU()]
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


def gather_position_bias(table: torch.Tensor, window: int) -> torch.Tensor:
    """table[..., relative_bias_indices(window)] as a product with a one-hot matrix through
    the deterministic GEMM, so the gradient adds each entry's uses in a fixed order (an
    indexed gather's backward scatters with atomic adds on CUDA). The forward is exact:
    one term of each sum is nonzero."""
    one_hot = _bias_one_hot(window, table.shape[-1], table.dtype, table.device)
    return det_linear(table, one_hot).view(*table.shape[:-1], window * window, window * window)


@functools.lru_cache(maxsize=16)
def _bias_one_hot(window: int, size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # (window⁴, table size), shared by every block of a window size
    return F.one_hot(relative_bias_indices(window).flatten(), size).to(dtype=dtype, device=device)


def encoder_grids(grid: tuple[int, int], strides: tuple[int, ...]) -> list[tuple[int, int]]:
    """The (H, W) each encoder stage works on: each cross-embedding divides by its stride."""
    grids, (h, w) = [], grid
    for stride in strides:
        h, w = h // stride, w // stride
        grids.append((h, w))
    return grids


def check_windows(grid: tuple[int, int], strides: tuple[int, ...], local: tuple[int, ...],
                  global_: tuple[int, ...], what: str) -> None:
    """Every stage's grid must tile into its local and global windows; one error naming
    the stage and the keys otherwise."""
    for stage, ((h, w), lw, gw) in enumerate(zip(encoder_grids(grid, strides), local, global_)):
        for key, window in (("local_window_size", lw), ("global_window_size", gw)):
            if h % window or w % window or h == 0 or w == 0:
                raise ValueError(
                    f"model.{key}[{stage}]={window} does not tile stage {stage}'s grid {h}x{w} "
                    f"({what} divided by model.cross_embed_strides[:{stage + 1}]={list(strides[:stage + 1])}); "
                    f"choose windows that divide it"
                )


def stage_multiple(strides: tuple[int, ...], local: tuple[int, ...], global_: tuple[int, ...]) -> int:
    """The number a grid must divide by for `check_windows` to pass."""
    multiple, scale = 1, 1
    for stride, lw, gw in zip(strides, local, global_):
        scale *= stride
        multiple = math.lcm(multiple, scale * math.lcm(lw, gw))
    return multiple
