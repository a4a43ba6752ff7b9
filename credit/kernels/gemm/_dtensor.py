"""DetLinear under torch tensor parallelism (DTensor parameters on a 1-D mesh).

``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel`` turns the
weight into a DTensor and hands the forward a DTensor input.  The kernels work
on local shards, so the layer computes on ``to_local()`` views and rewraps:

* weight ``Shard(0)`` (colwise, N split): input must be replicated; the
  output is ``Shard(-1)``.
* weight ``Shard(1)`` (rowwise, K split): input must be ``Shard(-1)``; the
  local fp32 partial sums are all-reduced, then the bias is added and the
  result rounded once.  With K split into 2 equal 32-aligned halves this is
  bitwise the unsharded result (the K tree's root is ``left + right``).
* weight ``Replicate()``: purely local.

A plain-tensor input is taken to be the local shard already.  Any other
layout raises ``NotImplementedError`` naming it.
"""

from __future__ import annotations

import torch

from ._ops import add_bias_fp32, linear_local


def dtensor_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, backend: str
) -> torch.Tensor:
    """Forward of ``DetLinear`` when its weight (or input) is a DTensor."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

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

    def local(t: torch.Tensor, want, what: str, grad=None) -> torch.Tensor:
        if not isinstance(t, DTensor):
            return t
        if t.device_mesh != mesh:
            raise ValueError(f"DetLinear: {what} lives on a different device mesh than the weight")
        if t.placements[0] != want:
            t = t.redistribute(mesh, [want])
        return t.to_local(grad_placements=grad)

    b_local = None
    if isinstance(wp, Shard) and wp.dim == 0:  # ColwiseParallel
        # Each rank's dx only covers its N shard: the input gradient is Partial.
        x_local = local(x, Replicate(), "input", grad=[Partial()])
        if bias is not None:
            b_local = local(bias, Shard(0), "bias")
        y = linear_local(x_local, weight.to_local(), b_local, backend)
        return DTensor.from_local(y, mesh, [Shard(y.dim() - 1)], run_check=False)
    if isinstance(wp, Shard) and wp.dim == 1:  # RowwiseParallel
        x_in = x
        if isinstance(x, DTensor):
            x_in = local(x, Shard(x.dim() - 1), "input")
        part = linear_local(x_in, weight.to_local(), None, backend, out_dtype=torch.float32)
        y = DTensor.from_local(part, mesh, [Partial()], run_check=False)
        # Reduce before adding the bias so the sum order matches the K tree.
        y = y.redistribute(mesh, [Replicate()])
        if bias is not None:
            bl = local(bias, Replicate(), "bias")
            y = DTensor.from_local(add_bias_fp32(y.to_local(), bl, backend), mesh,
                                   [Replicate()], run_check=False)
        return y.to(weight.dtype)
    if isinstance(wp, Replicate):
        x_local = local(x, Replicate(), "input")
        if bias is not None:
            b_local = local(bias, Replicate(), "bias")
        y = linear_local(x_local, weight.to_local(), b_local, backend)
        return DTensor.from_local(y, mesh, [Replicate()], run_check=False)
    raise NotImplementedError(
        f"DetLinear: weight placement {wp} is not supported; use Shard(0) "
        "(ColwiseParallel), Shard(1) (RowwiseParallel) or Replicate()"
    )
