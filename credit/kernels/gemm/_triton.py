"""Triton backend: launcher and availability (kernel in ``_triton_kernel.py``).

Runs on CUDA GPUs with compute capability 8.0+.  With ``TRITON_INTERPRET=1``
set before the first use of this backend, Triton's interpreter runs the same
kernel on CPU tensors (slow; used by the test suite on machines without GPU).
"""

from __future__ import annotations

import importlib.util
import os

import torch

from ._tree import LEAF, num_leaves


def _interpret_env() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def _kernel_is_interpreted() -> bool:
    from . import _triton_kernel

    return type(_triton_kernel.det_mm_kernel).__name__ == "InterpretedFunction"


def unavailable_reason(device: torch.device) -> str | None:
    """``None`` if the triton backend can run on ``device``, else why not."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available"
        major, minor = torch.cuda.get_device_capability(device)
        if major < 8:
            return f"needs compute capability 8.0+, device has {major}.{minor}"
        if _kernel_is_interpreted():
            return "the kernel was defined under TRITON_INTERPRET=1 (interpreter mode)"
        return None
    if device.type == "cpu":
        if not _interpret_env():
            return "needs a CUDA GPU (or TRITON_INTERPRET=1 to interpret it on CPU tensors)"
        if not _kernel_is_interpreted():
            return "TRITON_INTERPRET=1 was set after the kernel was compiled for the GPU"
        return None
    return f"device type {device.type!r} is not supported by triton"


def mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``a @ b`` with the Triton kernel; inputs already validated."""
    from . import _triton_kernel as tk

    interpreted = _kernel_is_interpreted()
    # The interpreter truncates fp32 -> bfloat16 instead of rounding to nearest-even (the
    # GPU's cvt.rn); there the kernel writes fp32 and torch performs the single rounding.
    kernel_out = torch.float32 if interpreted else out_dtype
    major = torch.cuda.get_device_capability(a.device)[0] if a.device.type == "cuda" else 9
    limit = tk.max_depth(_dtype_name(a.dtype), major)
    return _tree_mm(a, b, kernel_out, tk, limit).to(out_dtype)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tree_depth(n: int) -> int:
    """Height of ``T(n)``: levels of partial tiles a kernel holds for ``n`` leaves."""
    return (n - 1).bit_length()


def _tree_mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, tk, limit: int
             ) -> torch.Tensor:
    K = a.shape[1]
    n = num_leaves(K)
    if tree_depth(n) > limit:
        # The top of a tall tree: T(n) = T(ceil(n/2)) + T(floor(n/2)), each half exactly
        # the subtree over its leaves, added once in fp32 (no rounding in between).
        split = -(-n // 2) * LEAF
        left = _tree_mm(a[:, :split], b[:split], torch.float32, tk, limit)
        right = _tree_mm(a[:, split:], b[split:], torch.float32, tk, limit)
        return (left + right).to(out_dtype)
    return _launch(a, b, out_dtype, tk)


def _launch(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, tk) -> torch.Tensor:
    M, K = a.shape
    N = b.shape[1]
    out = torch.empty((M, N), dtype=out_dtype, device=a.device)
    if M == 0 or N == 0:
        return out
    n = num_leaves(K)
    bm, bn, warps, stages = tk.TILES[_dtype_name(a.dtype)]
    grid = (-(-M // bm) * -(-N // bn),)
    tk.det_mm_kernel[grid](
        a, b, out, M, N,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
        K=K, N_LEAVES=n, DEPTH=tree_depth(n), BM=bm, BN=bn, LEAF=LEAF, GROUP=tk.GROUP_M,
        STAGES=stages, INTERPRET=_kernel_is_interpreted(), num_warps=warps,
        enable_fp_fusion=False,  # no mul+add contraction outside the leaf dot
    )
    return out
