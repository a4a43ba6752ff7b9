"""Sequence parallelism: the rows of a channels-last (B, H, W, C) grid split over the tp group.

Between the tensor-parallel matmuls of a transformer stage, tp rank r holds rows
[r·H/tp, (r+1)·H/tp) of the residual stream, so the residual additions, the norms and
everything the stage keeps for backward outside the attention and feed-forward interiors
take 1/tp of the memory. A sharded block gathers the normalised rows once before its
column-parallel projections and leaves its row-parallel projection through a reduce-scatter
along the rows (`RowwiseParallel(output_layouts=Shard(1))`): the same volume as the
all-reduce tensor parallelism alone would do, split in two.

A stage runs sequence-parallel when its rows split evenly over the tp ranks (and, with
`model.gemm=deterministic`, when each rank's rows of a sample are whole 32-row leaves of the
GEMM's reduction tree, which is what keeps the bits of one process); otherwise it runs as
plain tensor parallelism. The model says which modules are stages and their grids
(`_sequence_grid`, the (H, W) a stage works on); the parallelizer decides here and marks
every module under a chosen stage that declares a `sequence_mesh` attribute.

Hand-written autograd functions (not `torch.distributed.nn`) because the backward of a
gather depends on who already summed the gradient: after a deterministic column-parallel
layer (which tree-sums its input gradient across ranks) it is this rank's rows, after
torch's DTensor matmul (a Partial gradient) a reduce-scatter, and only the first is exact.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from credit.kernels.gemm._tree import LEAF

log = logging.getLogger(__name__)

ROW_DIM = 1  # rows of a channels-last (B, H, W, C) grid


def _gather(t: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _own(t: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    return t.chunk(size, dim=dim)[rank].contiguous()


class _OwnRows(torch.autograd.Function):
    """Forward: this rank's rows of a tensor every rank holds whole; backward: the ranks'
    row gradients gathered (each rank's rows only reach its own gradient)."""

    @staticmethod
    def forward(ctx, x, group, dim):  # type: ignore[override]
        ctx.group, ctx.dim = group, dim
        return _own(x, group, dim)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _gather(grad, ctx.group, ctx.dim), None, None


class _GatherRows(torch.autograd.Function):
    """Forward: every rank's rows concatenated; backward: this rank's rows of a gradient that
    is already whole and equal on every rank (a replicated consumer, or one that summed it)."""

    @staticmethod
    def forward(ctx, x, group, dim):  # type: ignore[override]
        ctx.group, ctx.dim = group, dim
        return _gather(x, group, dim)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _own(grad, ctx.group, ctx.dim), None, None


def own_rows(x: torch.Tensor, mesh: DeviceMesh, dim: int = ROW_DIM) -> torch.Tensor:
    """This rank's contiguous part of `x` along `dim` (`x` whole and equal on every rank)."""
    return _OwnRows.apply(x, mesh.get_group(), dim)


def gather_rows(x: torch.Tensor, mesh: DeviceMesh, dim: int = ROW_DIM) -> torch.Tensor:
    """All ranks' parts along `dim`; for consumers that hand back a whole, equal gradient."""
    return _GatherRows.apply(x, mesh.get_group(), dim)


def gather_rows_partial(x: torch.Tensor, mesh: DeviceMesh, dim: int = ROW_DIM) -> DTensor:
    """All ranks' parts along `dim` as a replicated DTensor, for torch's column-parallel
    layers: their input gradient is Partial, and the backward reduce-scatters it."""
    sharded = DTensor.from_local(x, mesh, [Shard(dim)], run_check=False)
    return sharded.redistribute(mesh, [Replicate()])


@contextlib.contextmanager
def saving_rows_only(local: torch.Tensor, full: torch.Tensor, mesh: DeviceMesh,
                     dim: int = ROW_DIM) -> Iterator[None]:
    """Inside, a tensor saved for backward that is a view of `full` (the gather of `local`
    along `dim`) is kept as `local` and gathered again when the backward first needs it,
    shared by every layer that saved it: a block's column-parallel layers then keep 1/tp of
    their input between forward and backward instead of all of it, for one more all-gather.
    Not for use under activation checkpointing, which recomputes the gather anyway."""
    gathered = full._local_tensor if isinstance(full, DTensor) else full
    storage = gathered.untyped_storage().data_ptr()
    rows, group, regathered = local.detach(), mesh.get_group(), {}

    def pack(t: torch.Tensor) -> object:
        base = t._local_tensor if isinstance(t, DTensor) else t
        if base.untyped_storage().data_ptr() != storage:
            return t
        layout = (t.device_mesh, t.placements, t.shape, t.stride()) if isinstance(t, DTensor) else None
        return _Regather(base.shape, base.stride(), base.storage_offset(), layout)

    def unpack(saved: object) -> torch.Tensor:
        if not isinstance(saved, _Regather):
            return saved
        if "full" not in regathered:
            regathered["full"] = _gather(rows, group, dim)
        view = regathered["full"].as_strided(saved.shape, saved.stride, saved.offset)
        if saved.layout is None:
            return view
        device_mesh, placements, shape, stride = saved.layout
        return DTensor.from_local(view, device_mesh, placements, run_check=False, shape=shape, stride=stride)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


class _Regather:
    """What `saving_rows_only` keeps of a saved view of the gathered tensor: where it lies."""

    __slots__ = ("shape", "stride", "offset", "layout")

    def __init__(self, shape, stride, offset, layout) -> None:
        self.shape, self.stride, self.offset, self.layout = shape, stride, offset, layout


def stage_fits(grid: tuple[int, int], tp: int, deterministic: bool) -> str | None:
    """Why a stage of `grid` cannot run sequence-parallel over `tp` ranks (None: it can)."""
    rows, cols = grid
    if rows % tp:
        return f"{rows} rows do not split over {tp} ranks"
    if deterministic and (rows // tp * cols) % LEAF:
        return (f"{rows // tp}x{cols} points per rank are not whole {LEAF}-row leaves of the "
                f"deterministic GEMM's tree")
    return None


def apply_sequence_parallel(model: nn.Module, tp_mesh: DeviceMesh, deterministic: bool,
                            activation_checkpointing: bool = False) -> list[str]:
    """Choose the stages that run sequence-parallel and mark their modules; return their
    names (the parallelizer gives the row-parallel layers under them row-sharded outputs).
    Without activation checkpointing the blocks keep only their rows of a gathered input for
    backward (`saving_rows_only`); with it the whole unit is recomputed instead.

    Raises ValueError when the model declares no stage (nothing to shard)."""
    tp = tp_mesh.size()
    stages = [(n, m) for n, m in model.named_modules() if getattr(m, "_sequence_grid", None)]
    if not stages:
        raise ValueError(f"trainer.parallelism.sequence_parallel=true but {type(model).__name__} has no "
                         f"stage that can shard its rows; use sequence_parallel=false")
    chosen, skipped = [], []
    for name, stage in stages:
        problem = stage_fits(tuple(stage._sequence_grid), tp, deterministic)
        if problem:
            skipped.append(f"{name} ({problem})")
            continue
        for module in stage.modules():
            if hasattr(module, "sequence_mesh"):
                module.sequence_mesh = tp_mesh
                module.sequence_regather = not activation_checkpointing
        chosen.append(name)
    log.info("sequence parallel (tp=%d): %d of %d stages shard their rows%s", tp, len(chosen), len(stages),
             f"; plain tensor parallel in {', '.join(skipped)}" if skipped else "")
    return chosen
