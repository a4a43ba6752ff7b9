"""CREDIT's `wxformer` / `wxformer_base` (its current CrossFormer,
`credit.models.wxformer.crossformer.CrossFormer`): cross-scale encoder of four
cross-embedding + windowed-attention stages, sub-pixel decoder with skip connections.

Takes and returns CREDIT's layout: input (B, C, T, H, W) with C = channels·levels +
surface_channels + input_only_channels per frame, output (B, C_out, 1, H, W) with
C_out = channels·levels + surface_channels + output_only_channels, the full next state
(no residual added by the model). Frames are folded channel-major, time-minor
((B, C, T) -> (B, C·T)), as CREDIT does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from credit.models.credit.convs import CrossEmbedLayer, UpBlockPS, output_head, resize
from credit.models.credit.layers import Transformer, check_windows, encoder_grids
from credit.models.padding import BoundaryPadding
from credit.models.dropout import IndexedDropout
from credit.parallel.sequence import gather_rows


@dataclass(frozen=True)
class CreditSpec:
    """The constructor arguments both of CREDIT's architectures share, CREDIT's names."""

    image_height: int
    image_width: int
    frames: int
    channels: int
    levels: int
    surface_channels: int
    input_only_channels: int
    output_only_channels: int
    dim: tuple[int, int, int, int]
    depth: tuple[int, int, int, int]
    dim_head: int
    global_window_size: tuple[int, int, int, int]
    local_window_size: tuple[int, int, int, int]
    cross_embed_kernel_sizes: tuple[tuple[int, ...], ...]
    cross_embed_strides: tuple[int, int, int, int]
    attn_dropout: float = 0.0
    ff_dropout: float = 0.0
    use_spectral_norm: bool = True

    @property
    def frame_channels(self) -> int:
        return self.channels * self.levels + self.surface_channels + self.input_only_channels

    @property
    def output_channels(self) -> int:
        return self.channels * self.levels + self.surface_channels + self.output_only_channels

    @property
    def grid(self) -> tuple[int, int]:
        return self.image_height, self.image_width

    def check_input(self, x: torch.Tensor, model: str) -> None:
        """CREDIT's (B, C, T, H, W) of this spec, or a ValueError saying what was expected."""
        expected = (self.frame_channels, self.frames, *self.grid)
        if x.dim() != 5 or tuple(x.shape[1:]) != expected:
            raise ValueError(f"{model} expects input (B, {', '.join(map(str, expected))}) "
                             f"(B, C, T, H, W), got {tuple(x.shape)}")


def build_encoder(spec: CreditSpec, in_channels: int, gemm: str, grid: tuple[int, int]) -> nn.ModuleList:
    """`layers`: four (CrossEmbedLayer, Transformer) pairs for an input `grid` (after any
    padding); each transformer knows its stage's grid (sequence parallelism splits its rows)."""
    dims = (in_channels, *spec.dim)
    layers = nn.ModuleList(
        nn.ModuleList([
            CrossEmbedLayer(dims[i], dims[i + 1], spec.cross_embed_kernel_sizes[i], spec.cross_embed_strides[i],
                            gemm),
            Transformer(dims[i + 1], local_window_size=spec.local_window_size[i],
                        global_window_size=spec.global_window_size[i], depth=spec.depth[i],
                        dim_head=spec.dim_head, attn_dropout=spec.attn_dropout, ff_dropout=spec.ff_dropout,
                        gemm=gemm),
        ])
        for i in range(4)
    )
    for (_, transformer), stage_grid in zip(layers, encoder_grids(grid, spec.cross_embed_strides)):
        transformer._sequence_grid = stage_grid
    return layers


def number_dropouts(model: nn.Module) -> None:
    """Each indexed dropout draws its own stream: number them in module order."""
    for layer, module in enumerate(m for m in model.modules() if isinstance(m, IndexedDropout)):
        module.layer = layer


def check_decoder_widths(dim: tuple[int, ...]) -> None:
    """CREDIT's decoder halves the width at each up block and concatenates the skip of
    the stage below, so the stage widths must double: (d, 2d, 4d, 8d)."""
    last = dim[-1]
    expected = [last // 8, last // 4, last // 2, last]
    if len(dim) != 4 or list(dim) != expected or last % 8:
        raise ValueError(
            f"model.dim={list(dim)} is invalid: CREDIT's decoder needs four stage widths that "
            f"double, (d, 2d, 4d, 8d); e.g. {expected if last % 8 == 0 else [64, 128, 256, 512]}"
        )


class WXFormer(nn.Module):
    """CREDIT's current CrossFormer (registry types `wxformer`, `wxformer_base`) with Linear
    projections; state-dict keys are CREDIT's."""

    input_layout = "credit"  # (B, C, T, H, W) in, (B, C_out, 1, H, W) out
    # the units data parallelism wraps one by one: each stage's cross-embedding and transformer, each up block
    _shard_units = ("layers.0", "layers.1", "layers.2", "layers.3", "up_block1", "up_block2", "up_block3", "up_block4")
    # set by credit.parallel.sequence when the whole model runs on rows (sequence_rows_fit)
    sequence_mesh: DeviceMesh | None = None

    credit_type = "wxformer"  # CREDIT's registry name, in errors

    def __init__(self, spec: CreditSpec, *, interp: bool = True,
                 padding: BoundaryPadding | None = None, gemm: str = "fast", **decoder: Any) -> None:
        super().__init__()
        check_decoder_widths(spec.dim)
        self.spec, self.use_interp, self.padding = spec, interp, padding
        # CREDIT's post blocks (`credit.models.credit.postblocks`), set when `post_conf` is active: the
        # fixers inside the forward, and those CREDIT applies after it (`inputs.predict` does)
        self.post_blocks: nn.Module | None = None
        self.outside_post_blocks: nn.Module | None = None
        self.deterministic = gemm == "deterministic"
        padded = padding.padded(spec.grid) if padding else spec.grid
        if padding:
            padding.check(spec.grid)
        check_windows(padded, spec.cross_embed_strides, spec.local_window_size, spec.global_window_size,
                      "the padded grid" if padding else "the grid")
        self.layers = build_encoder(spec, spec.frame_channels * spec.frames, gemm, padded)
        self.build_decoder(spec, gemm, **decoder)
        number_dropouts(self)

    def build_decoder(self, spec: CreditSpec, gemm: str) -> None:
        """`up_block1`..`up_block3` (each doubling the grid; the skips are concatenated after
        the first two and the third) and the output head `up_block4`."""
        last = spec.dim[-1]
        self.up_block1 = UpBlockPS(last, last // 2, spec.dim[0], gemm=gemm)
        self.up_block2 = UpBlockPS(last, last // 4, spec.dim[0], gemm=gemm)
        self.up_block3 = UpBlockPS(last // 2, last // 8, spec.dim[0], gemm=gemm)
        self.up_block4 = output_head(last // 4, spec.output_channels, icnr=True, gemm=gemm)

    def sequence_rows_fit(self, tp: int) -> str | None:
        """Why the whole model cannot run on rows split over `tp` ranks (None: it can).

        Each rank must make the same number of rows at every stage, so the decoder meets its
        skips row for row: the first cross-embedding's output rows must split evenly (its
        input is split in stride-sized steps, any rows left over going to the last rank, as
        CREDIT's odd padded heights need), every later stage's input rows must split into
        whole strides per rank, and each rank must hold the rows a cross-embedding reaches
        into its neighbours."""
        rows = self.padding.padded(self.spec.grid)[0] if self.padding else self.spec.grid[0]
        for stage, ((embed, _), stride) in enumerate(zip(self.layers, self.spec.cross_embed_strides)):
            made = rows // stride
            per_rank = made // tp * stride  # input rows per rank (the last also takes any remainder)
            if made % tp or (stage and rows % (tp * stride)) or per_rank < embed.halo():
                return (f"stage {stage}'s cross-embedding takes {rows} rows to {made} (stride {stride}): "
                        f"{made / tp:g} per rank")
            rows = made
        return None

    def _input_rows(self, x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        """This rank's input rows: whole strides of the first cross-embedding, the rows left
        over on the last rank (`sequence_rows_fit`)."""
        rank, tp, stride = mesh.get_local_rank(), mesh.size(), self.spec.cross_embed_strides[0]
        per_rank = x.shape[2] // stride // tp * stride
        start = rank * per_rank
        return x[:, :, start:x.shape[2] if rank == tp - 1 else start + per_rank]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        spec.check_input(x, self.credit_type)
        inputs = x
        if self.padding:
            x = self.padding.pad(x)
        x = x.flatten(1, 2)  # channel-major, time-minor
        mesh = self.sequence_mesh
        if mesh is not None:  # every layer below works on this rank's rows
            x = self._input_rows(x, mesh)
        encodings = []
        for embed, transformer in self.layers:
            x = transformer(embed(x))
            encodings.append(x)
        x = torch.cat([self.up_block1(x), encodings[2]], dim=1)
        x = torch.cat([self.up_block2(x), encodings[1]], dim=1)
        x = torch.cat([self.up_block3(x), encodings[0]], dim=1)
        x = self.up_block4(x)
        if mesh is not None:
            x = gather_rows(x, mesh, dim=2)
        if self.padding:
            x = self.padding.unpad(x)
        if self.use_interp:
            x = resize(x, spec.grid, self.deterministic)
        # a fresh tensor, not a view: FSDP2's pre-backward hook on a wrapped root's output
        # would be lost to an in-place op on a view
        x = x.unsqueeze(2).clone()
        if self.post_blocks is not None:  # on the whole grid, the same on every tp rank
            x = self.post_blocks(x, inputs.detach())
        return x
