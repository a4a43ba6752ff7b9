"""Differentiable entry points ``det_mm`` and ``det_linear``.

Forward and backward use the same deterministic kernel:

* ``C = A @ B``    reduces over K with the fixed K tree;
* ``dA = dC @ Bᵀ``  reduces over N with the same tree (leaves of 32 columns);
* ``dB = Aᵀ @ dC``  reduces over M, the batch rows, with the same tree
  (leaves of 32 consecutive rows, in row order).  ``dB`` (``dW`` for a linear
  layer, and the bias gradient) is therefore a fixed function of the rows
  and their order: independent of thread count, of N, of how the kernel tiles
  the work, and of zero-gradient rows appended inside the last 32-row leaf;
  a batch split into 2/4/8 equal 32-aligned parts whose partial gradients
  are added pairwise reproduces it bitwise.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ._registry import kernel, resolve
from ._tree import LEAF

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)


def _is_dtensor(t: object) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return False
    return isinstance(t, DTensor)


def _check_tensor(name: str, t: object, op: str) -> torch.Tensor:
    if _is_dtensor(t):
        raise TypeError(
            f"{op}: {name} is a DTensor; the kernels take local tensors. Use DetLinear "
            "(which handles the ColwiseParallel/RowwiseParallel layouts) or pass .to_local()"
        )
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{op}: {name} has dtype {t.dtype}; supported: {[str(d) for d in SUPPORTED_DTYPES]}"
        )
    return t


def _check_pair(a: torch.Tensor, b: torch.Tensor, names: tuple[str, str], op: str) -> None:
    if a.dtype != b.dtype:
        raise TypeError(
            f"{op}: {names[0]} and {names[1]} must share a dtype, got {a.dtype} and {b.dtype}"
        )
    if a.device != b.device:
        raise ValueError(
            f"{op}: {names[0]} and {names[1]} must be on the same device, "
            f"got {a.device} and {b.device}"
        )


def _check_out_dtype(out_dtype: torch.dtype | None, dtype: torch.dtype, op: str) -> torch.dtype:
    if out_dtype is None or out_dtype == dtype:
        return dtype
    if out_dtype == torch.float32:
        return out_dtype
    raise TypeError(f"{op}: out_dtype={out_dtype}; allowed: None, {dtype}, torch.float32")


def _mm(a: torch.Tensor, b: torch.Tensor, backend: str, out_dtype: torch.dtype,
        whole: bool = False) -> torch.Tensor:
    """Run a resolved backend on validated 2-D operands (handles empty shapes). `whole`: no
    tensor-parallel split ever cuts this K, so the triton backend may run it as one chain;
    the other backends have one order for every reduction."""
    M, K = a.shape
    K2, N = b.shape
    if K != K2:  # guards every internal call too (backward shapes)
        raise ValueError(f"det_mm: inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)}")
    if M == 0 or N == 0 or K == 0:
        return torch.zeros((M, N), dtype=out_dtype, device=a.device)
    if whole and backend == "triton":
        from . import _triton

        return _triton.mm(a, b, out_dtype, whole=True)
    return kernel(backend)(a, b, out_dtype)


class _DetMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, backend, out_dtype, whole_k):  # type: ignore[override]
        ctx.save_for_backward(a, b)
        ctx.backend = backend
        return _mm(a, b, backend, out_dtype, whole_k)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        a, b = ctx.saved_tensors
        # Gradients are computed in the operands' dtype (one rounding of an
        # fp32 upstream gradient when out_dtype was float32).
        g = grad.to(a.dtype)
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga = _mm(g, b.t(), ctx.backend, a.dtype)  # tree over N
        if ctx.needs_input_grad[1]:
            gb = _mm(a.t(), g, ctx.backend, b.dtype)  # tree over M (rows, in order)
        return ga, gb, None, None, None


def det_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    backend: str = "auto",
    out_dtype: torch.dtype | None = None,
    whole_k: bool = False,
) -> torch.Tensor:
    """Deterministic, batch-invariant ``a (M, K) @ b (K, N)``; differentiable.

    ``a`` and ``b`` must share a device and a dtype (float32, bfloat16 or
    float16).  Accumulation is fp32 with the fixed K tree; the result is
    rounded once to ``out_dtype`` (default: the input dtype; ``torch.float32``
    returns the unrounded accumulation, e.g. for tensor-parallel partial sums).
    ``backend``: ``"auto"``, ``"cpu"``, ``"triton"``, ``"cuda"`` or
    ``"reference"`` (plain ``torch.matmul``, not deterministic).
    ``whole_k=True`` promises that no tensor-parallel split ever cuts this K: the triton
    backend then runs the forward product as one MMA chain over K (no tree, several times
    faster); the gradients keep the tree.
    """
    op = "det_mm"
    _check_tensor("a", a, op)
    _check_tensor("b", b, op)
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(
            f"{op}: expects 2-D a (M, K) and b (K, N), got shapes {tuple(a.shape)} and "
            f"{tuple(b.shape)}"
        )
    _check_pair(a, b, ("a", "b"), op)
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"{op}: inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}"
        )
    odt = _check_out_dtype(out_dtype, a.dtype, op)
    name = resolve(backend, a.device)
    return _DetMM.apply(a, b, name, odt, whole_k)


def pad_row_groups(t: torch.Tensor, groups: int) -> torch.Tensor:
    """Rows of ``t (M, N)`` as ``groups`` equal consecutive groups, each zero-padded to whole
    ``LEAF``-row leaves, so a reduction over rows never mixes two groups in one leaf (a
    group's rows, e.g. one sample's tokens, then form whole subtrees of the row tree)."""
    rows = t.shape[0] // groups
    if groups <= 1 or rows % LEAF == 0:  # one group: the kernel pads its last leaf itself
        return t
    padded = -(-rows // LEAF) * LEAF
    out = t.new_zeros((groups, padded, t.shape[1]))
    out[:, :rows] = t.view(groups, rows, t.shape[1])
    return out.view(groups * padded, t.shape[1])


def grouped_weight_grad(g: torch.Tensor, x2: torch.Tensor, groups: int, backend: str,
                        dtype: torch.dtype) -> torch.Tensor:
    """``gᵀ @ x2`` reduced over the rows in ``groups`` each padded to whole leaves."""
    if backend == "cpu" and groups > 1 and min(g.shape[0], g.shape[1], x2.shape[1]) > 0:
        from . import _cpu

        # the padded rows' bits, without their copies or their products
        return _cpu.mm(g.t(), x2, dtype, k_groups=groups)
    return _mm(pad_row_groups(g, groups).t(), pad_row_groups(x2, groups), backend, dtype)


def row_sum(g: torch.Tensor, groups: int, backend: str, dtype: torch.dtype) -> torch.Tensor:
    """Sum over the rows of ``g (M, N)`` with the fixed row tree, rows in ``groups``."""
    if backend == "cpu" and g.dtype == torch.float32 and g.shape[0] > 0:
        from . import _cpu

        # the bits of the 1-row GEMM below over the padded rows, at memory speed, unpadded
        return _cpu.colsum(g, groups).to(dtype)
    g = pad_row_groups(g, groups)
    ones = torch.ones((1, g.shape[0]), dtype=g.dtype, device=g.device)
    return _mm(ones, g, backend, dtype)[0]


def row_sum_of_products(g: torch.Tensor, x: torch.Tensor, groups: int, backend: str,
                        dtype: torch.dtype) -> torch.Tensor:
    """``row_sum(g * x, ...)``'s bits; on the CPU without the product's temporary."""
    if backend == "cpu" and g.dtype == x.dtype == torch.float32 and g.shape[0] > 0:
        from . import _cpu

        return _cpu.colsum(g, groups, times=x).to(dtype)
    return row_sum(g * x, groups, backend, dtype)


class _DetLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias, backend, out_dtype, groups=1,  # type: ignore[override]
                whole=(False, False)):
        ctx.save_for_backward(x2, weight)
        ctx.backend, ctx.groups, ctx.whole_n = backend, groups, whole[1]
        ctx.has_bias = bias is not None
        wt = weight.t()
        if bias is None:
            return _mm(x2, wt, backend, out_dtype, whole[0])
        # Bias is added to the fp32 accumulator; one rounding at the end.
        if backend == "cpu" and min(x2.shape[0], x2.shape[1], wt.shape[1]) > 0:
            return kernel(backend)(x2, wt, out_dtype, bias)  # added inside the kernel's store
        y = _mm(x2, wt, backend, torch.float32, whole[0]) + bias.to(torch.float32)
        return y.to(out_dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        x2, weight = ctx.saved_tensors
        be, dt = ctx.backend, x2.dtype
        g = grad.to(dt)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _mm(g, weight, be, dt, ctx.whole_n)  # (M, N) @ (N, K): over N
        if ctx.needs_input_grad[1]:  # (N, M) @ (M, K): tree over rows M (grouped)
            gw = grouped_weight_grad(g, x2, ctx.groups, be, dt)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = row_sum(g, ctx.groups, be, dt)  # same row tree as dW
        return gx, gw, gb, None, None, None, None


class _BiasAdd(torch.autograd.Function):
    """``y32 + bias`` in fp32 whose bias gradient uses the deterministic row tree
    (the same reduction as ``det_linear``'s bias gradient)."""

    @staticmethod
    def forward(ctx, y32, bias, backend, groups=1):  # type: ignore[override]
        ctx.backend, ctx.bias_dtype, ctx.groups = backend, bias.dtype, groups
        return y32 + bias.to(torch.float32)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        g = grad.reshape(-1, grad.shape[-1]).to(ctx.bias_dtype)
        gb = None
        if ctx.needs_input_grad[1]:
            gb = row_sum(g, ctx.groups, ctx.backend, ctx.bias_dtype)
        return grad, gb, None, None


def add_bias_fp32(y32: torch.Tensor, bias: torch.Tensor, backend: str, groups: int = 1) -> torch.Tensor:
    """fp32 ``y32 (*, N) + bias (N,)`` with a batch-tree bias gradient (rows in ``groups``)."""
    return _BiasAdd.apply(y32, bias, resolve(backend, y32.device), groups)


def linear_local(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    backend: str,
    out_dtype: torch.dtype | None = None,
    groups: int = 1,
    whole: tuple[bool, bool] = (False, False),
) -> torch.Tensor:
    """``det_linear`` with an optional fp32 output (used for TP partial sums), the rows
    reduced for ``dW``/``dbias`` as ``groups`` equal groups padded to whole leaves
    (``pad_row_groups``), and `whole` = (forward K, input-gradient N): which of the layer's
    reductions no tensor-parallel split ever cuts (see ``DetLinear.whole_reductions``)."""
    op = "det_linear"
    _check_tensor("x", x, op)
    _check_tensor("weight", weight, op)
    if weight.dim() != 2:
        raise ValueError(f"{op}: weight must be 2-D (N, K), got shape {tuple(weight.shape)}")
    if x.dim() < 1:
        raise ValueError(f"{op}: x must have at least 1 dimension (*, K), got a scalar")
    _check_pair(x, weight, ("x", "weight"), op)
    N, K = weight.shape
    if x.shape[-1] != K:
        raise ValueError(
            f"{op}: x's last dimension {x.shape[-1]} does not match weight (N, K) = {(N, K)}"
        )
    if bias is not None:
        _check_tensor("bias", bias, op)
        _check_pair(x, bias, ("x", "bias"), op)
        if bias.shape != (N,):
            raise ValueError(f"{op}: bias must have shape ({N},), got {tuple(bias.shape)}")
    odt = _check_out_dtype(out_dtype, x.dtype, op)
    name = resolve(backend, x.device)
    rows = x.numel() // K if K else 0
    if groups < 1 or rows % groups:
        raise ValueError(f"{op}: {rows} rows do not split into {groups} equal groups")
    y = _DetLinear.apply(x.reshape(-1, K), weight, bias, name, odt, groups, whole)
    return y.reshape(*x.shape[:-1], N)


def det_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Deterministic ``x (*, K) @ weight (N, K)ᵀ + bias``, like ``F.linear``.

    Leading dimensions of ``x`` are flattened into rows (row-major order); each
    output row is bitwise independent of the other rows.  The bias is added to
    the fp32 accumulator before the single rounding to ``x.dtype``.  Gradients:
    ``dx`` reduces over N, ``dW`` and ``dbias`` over the rows with the fixed
    tree (see this module's docstring).
    """
    return linear_local(x, weight, bias, backend)
