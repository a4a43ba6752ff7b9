"""DetLinear under torch tensor parallelism (DTensor parameters on a 1-D tp mesh).

Under FSDP2 on a 2-D (dp, tp) mesh the forward sees the gathered parameter, a DTensor on
the tp mesh alone, so the same code serves both.

``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel`` turns the
weight into a DTensor and hands the forward a DTensor input.  The kernels work
on local shards, so the layer computes on ``to_local()`` views and rewraps:

* weight ``Shard(0)`` (colwise, N split): input must be replicated; the
  output is ``Shard(-1)``.
* weight ``Shard(1)`` (rowwise, K split): input must be ``Shard(-1)``; the
  local fp32 partial sums are combined across ranks by the K tree's top levels
  (``tree_all_reduce``), then the bias is added and the result rounded once.
  With K split into 2, 4 or 8 equal 32-aligned parts this is bitwise the
  unsharded result.
* The column-parallel input gradient (each rank's ``dC·W`` covers its N shard)
  is combined the same way, in the backward of ``tree_all_reduce_grad``.

A ring all-reduce would not do: its summation order depends on the rank and on
the ring position, and at 4 ranks it differs from ``(p0 + p1) + (p2 + p3)``.
* weight ``Replicate()``: purely local.

A plain-tensor input is taken to be the local shard already.  Any other
layout raises ``NotImplementedError`` naming it.
"""

from __future__ import annotations

import torch

import torch.distributed as dist

from ._ops import add_bias_fp32, linear_local
from ._tree import tree_sum


def _tree_reduce(t: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's ``t`` gathered, then added by the K tree in rank order (same bits on every rank)."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return tree_sum(parts)


class _TreeAllReduce(torch.autograd.Function):
    """Forward: the fixed-tree sum over ``group``; backward: identity (each partial's
    gradient is the replicated output gradient)."""

    @staticmethod
    def forward(ctx, t, group):  # type: ignore[override]
        return _tree_reduce(t, group)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad, None


class _TreeAllReduceGrad(torch.autograd.Function):
    """Forward: identity on a replicated input; backward: the fixed-tree sum of the
    ranks' partial input gradients."""

    @staticmethod
    def forward(ctx, t, group):  # type: ignore[override]
        ctx.group = group
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _tree_reduce(grad, ctx.group), None


def tree_all_reduce(t: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Sum of ``t`` over ``group`` as a binary tree in rank order; differentiable."""
    return _TreeAllReduce.apply(t, group)


def tree_all_reduce_grad(t: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``t`` unchanged; its gradient becomes the rank-ordered tree sum over ``group``."""
    return _TreeAllReduceGrad.apply(t, group)


def dtensor_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, backend: str, groups: int = 1,
    whole: tuple[bool, bool] = (False, False),
) -> torch.Tensor:
    """Forward of ``DetLinear`` when its weight (or input) is a DTensor; `whole` is the layer's
    ``whole_reductions``, which must not claim a reduction this placement splits."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(weight, DTensor):
        raise TypeError(
            "DetLinear: got a DTensor input but a plain weight; parallelize the module "
            "(ColwiseParallel/RowwiseParallel) or pass x.to_local()"
        )
    mesh = weight.device_mesh
    if mesh.ndim != 1:
        raise NotImplementedError(
            f"DetLinear supports a 1-D device mesh, got a {mesh.ndim}-D mesh {mesh}"
        )
    wp = weight.placements[0]

    group = mesh.get_group()

    def local(t: torch.Tensor, want, what: str, grad=None) -> torch.Tensor:
        if not isinstance(t, DTensor):
            return t
        if t.device_mesh != mesh:
            raise ValueError(f"DetLinear: {what} lives on a different device mesh than the weight")
        if t.placements[0] != want:
            t = t.redistribute(mesh, [want])
        return t.to_local(grad_placements=grad)

    k_split = isinstance(wp, Shard) and wp.dim == 1  # rowwise: the forward's K is split
    n_split = isinstance(wp, Shard) and wp.dim == 0  # colwise: the input gradient's N is split
    if (whole[0] and k_split) or (whole[1] and n_split):
        raise ValueError(
            f"DetLinear: whole_reductions={whole} claims a reduction that the weight's placement "
            f"{wp} splits across ranks (K when Shard(1), N when Shard(0)); its one-chain result "
            "would differ from one process's. Mark layers from the tp plan "
            "(credit.models.layer_kit.mark_whole_reductions)")

    b_local = None
    if isinstance(wp, Shard) and wp.dim == 0:  # ColwiseParallel
        # Each rank's dx only covers its N shard: the partial input gradients are
        # tree-summed here, so DTensor sees a replicated gradient and adds no reduction.
        x_local = tree_all_reduce_grad(local(x, Replicate(), "input", grad=[Replicate()]), group)
        if bias is not None:
            b_local = local(bias, Shard(0), "bias")
        y = linear_local(x_local, weight.to_local(), b_local, backend, groups=groups, whole=whole)
        return DTensor.from_local(y, mesh, [Shard(y.dim() - 1)], run_check=False)
    if isinstance(wp, Shard) and wp.dim == 1:  # RowwiseParallel
        x_in = x
        if isinstance(x, DTensor):
            x_in = local(x, Shard(x.dim() - 1), "input")
        part = linear_local(x_in, weight.to_local(), None, backend, out_dtype=torch.float32,
                            groups=groups, whole=whole)
        # Reduce before adding the bias so the sum order matches the K tree.
        y = tree_all_reduce(part, group)
        if bias is not None:
            y = add_bias_fp32(y, local(bias, Replicate(), "bias"), backend, groups)
        return DTensor.from_local(y.to(weight.dtype), mesh, [Replicate()], run_check=False)
    if isinstance(wp, Replicate):
        x_local = local(x, Replicate(), "input")
        if bias is not None:
            b_local = local(bias, Replicate(), "bias")
        y = linear_local(x_local, weight.to_local(), b_local, backend, groups=groups, whole=whole)
        return DTensor.from_local(y, mesh, [Replicate()], run_check=False)
    raise NotImplementedError(
        f"DetLinear: weight placement {wp} is not supported; use Shard(0) "
        "(ColwiseParallel), Shard(1) (RowwiseParallel) or Replicate()"
    )
