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
every module under a chosen stage that declares a `sequence_mesh` attribute. A model that
can run whole on rows (`sequence_rows_fit`: wxformer's convolutions with halo rows, in
fast mode) is marked whole when every stage splits: then nothing is gathered between the
input and the output.

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


class _HaloRows(torch.autograd.Function):
    """Forward: this rank's rows of an NCHW tensor with `top` rows of the rank above and
    `bottom` rows of the rank below around them (zeros beyond the first and last rank, as a
    convolution's zero padding); backward: the halo rows' gradients sent back and added to
    the rows they came from."""

    @staticmethod
    def forward(ctx, x, top, bottom, group):  # type: ignore[override]
        ctx.top, ctx.bottom, ctx.group = top, bottom, group
        rank, size, rows = dist.get_rank(group), dist.get_world_size(group), x.shape[2]
        edges = torch.cat([x[:, :, :bottom], x[:, :, rows - top:]], dim=2)  # what the neighbours need
        parts = _gather(edges, group, 0).chunk(size, dim=0)
        above = parts[rank - 1][:, :, bottom:] if rank > 0 else x.new_zeros(*x.shape[:2], top, x.shape[3])
        below = parts[rank + 1][:, :, :bottom] if rank < size - 1 else x.new_zeros(*x.shape[:2], bottom, x.shape[3])
        return torch.cat([above, x, below], dim=2)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        top, bottom, group = ctx.top, ctx.bottom, ctx.group
        rank, size, rows = dist.get_rank(group), dist.get_world_size(group), grad.shape[2] - top - bottom
        own = grad[:, :, top:top + rows].clone()
        sent = torch.cat([grad[:, :, :top], grad[:, :, top + rows:]], dim=2)  # to the rank above, below
        parts = _gather(sent, group, 0).chunk(size, dim=0)
        if rank < size - 1 and top:  # the rank below used my last rows as its top halo
            own[:, :, rows - top:] += parts[rank + 1][:, :, :top]
        if rank > 0 and bottom:  # the rank above used my first rows as its bottom halo
            own[:, :, :bottom] += parts[rank - 1][:, :, top:]
        return own, None, None, None


def halo_rows(x: torch.Tensor, top: int, bottom: int, mesh: DeviceMesh) -> torch.Tensor:
    """This rank's rows of NCHW `x` with `top` rows above and `bottom` below from the
    neighbouring ranks (zeros at the grid's edges): what a convolution reaching across
    rows needs. Needs at least max(top, bottom) rows on every rank."""
    if top == 0 and bottom == 0:
        return x
    return _HaloRows.apply(x, top, bottom, mesh.get_group())


class _AllReduceSum(torch.autograd.Function):
    """Forward: the sum over the group; backward: the sum of the ranks' gradients (every
    rank used the same sum)."""

    @staticmethod
    def forward(ctx, t, group):  # type: ignore[override]
        ctx.group = group
        out = t.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        out = grad.contiguous().clone()
        dist.all_reduce(out, group=ctx.group)
        return out, None


def all_reduce_sum(t: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """The sum of `t` over the tp ranks, differentiable."""
    return _AllReduceSum.apply(t, mesh.get_group())


def partial_gradient_names(model: nn.Module) -> frozenset[str]:
    """Names of the parameters whose gradients, after backward, are this rank's partial sums
    over its rows (every tp rank holds them whole): what each module on rows declares with
    `sequence_partial_parameters()`. Fast mode sums them over the tp ranks after backward,
    in one reduction with the other replicated gradients (`sync_replicated_gradients`) or in
    FSDP2's reduce-scatter over dp x tp (`parallelize_model`); deterministic mode sums them
    inside the backward, in one process's order, and declares none."""
    names = set()
    for prefix, module in model.named_modules():
        declare = getattr(module, "sequence_partial_parameters", None)
        if declare is not None:
            names.update(f"{prefix}.{name}" if prefix else name for name in declare())
    return frozenset(names)


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
    storage = gathered.untyped_storage()._cdata  # the storage itself (fake tensors have no addresses)
    rows, group, regathered = local.detach(), mesh.get_group(), {}

    def pack(t: torch.Tensor) -> object:
        base = t._local_tensor if isinstance(t, DTensor) else t
        if base.untyped_storage()._cdata != storage:
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
                            regather: bool = False) -> list[str]:
    """Choose the stages that run sequence-parallel and mark their modules; return their
    names (the parallelizer gives the row-parallel layers under them row-sharded outputs).
    `regather`: the blocks keep only their rows of a gathered input for backward
    (`saving_rows_only`); pointless under activation checkpointing, which recomputes it all.

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
        _mark(stage, tp_mesh, regather)
        chosen.append(name)
    whole = _whole_model_problem(model, tp, deterministic, skipped)
    if whole is None:  # convolutions and decoder on rows too: nothing is gathered until the output
        _mark(model, tp_mesh, regather)
        for _, stage in stages:
            stage.sequence_rows_through = True
    log.info("sequence parallel (tp=%d): %d of %d stages shard their rows%s; %s", tp, len(chosen), len(stages),
             f"; plain tensor parallel in {', '.join(skipped)}" if skipped else "",
             "the whole model runs on rows" if whole is None else f"convolutions on whole grids ({whole})")
    return chosen


def _mark(root: nn.Module, tp_mesh: DeviceMesh, regather: bool) -> None:
    for module in root.modules():
        if hasattr(module, "sequence_mesh"):
            module.sequence_mesh = tp_mesh
            if hasattr(module, "sequence_regather"):  # the blocks that gather their inputs
                module.sequence_regather = regather


def _whole_model_problem(model: nn.Module, tp: int, deterministic: bool, skipped: list[str]) -> str | None:
    """Why the convolutions between the stages cannot run on rows too (None: they can)."""
    fits = getattr(model, "sequence_rows_fit", None)
    if fits is None:
        return f"{type(model).__name__} runs only its transformer stages on rows"
    if deterministic:  # their weight gradients and group-norm statistics would add in another order
        return "model.gemm=deterministic keeps them whole for one process's bits"
    if skipped:
        return "not every stage shards its rows"
    return fits(tp)
