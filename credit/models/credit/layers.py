"""The building blocks of CREDIT's `crossformer`, `wxformer` and `nextgen_wxformer`, with CREDIT's
state-dict keys and arithmetic.

Every projection is an `nn.Linear` over channels-last tokens (CREDIT's newest layout; its
older 1x1 convolutions load through `credit.models.credit.checkpoint`), and each
tensor-parallel block declares its `_tp_plan` beside it. A transformer stage permutes to
channels-last once and back once, so the channel LayerNorm (`norm.g`, `norm.b`, shaped
(1, C, 1, 1) as CREDIT stores them) runs as `F.layer_norm` over the last dimension.

`gemm="deterministic"` builds the same parameters with the fixed-tree layers of
`credit.models.layer_kit.layer_kit` and the written-out attention of `credit.models.credit.deterministic_attention`
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
from credit.models.credit.deterministic_attention import windowed_attention
from credit.models.deterministic.norms import row_layer_norm
from credit.models.dropout import IndexedDropout
from credit.models.fanout import fan_out
from credit.models.layer_kit import layer_kit, shard_of
from credit.models.windows import check_head_split, from_windows, residual_rounds, to_windows
from credit.parallel.sequence import gather_rows, gather_rows_partial, own_rows, saving_rows_only


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
            return row_layer_norm(x, g, b, self.eps, sequence_group)
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
        kit = layer_kit(gemm)
        linear = kit.linear
        self.layers = nn.Sequential(
            ChannelLayerNorm(dim, deterministic=deterministic), linear(dim, dim * mult), kit.gelu(),
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
