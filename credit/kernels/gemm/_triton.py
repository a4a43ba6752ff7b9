"""Triton backend: launcher and availability (kernel in ``_triton_kernel.py``).

Runs on CUDA GPUs with compute capability 8.0+.  With ``TRITON_INTERPRET=1``
set before the first use of this backend, Triton's interpreter runs the same
kernel on CPU tensors (slow; used by the test suite on machines without GPU).
"""

from __future__ import annotations

import importlib.util
import os

import torch

from ._tree import LEAF, merge_schedule, num_leaves, schedule_tensor

_PROGRAMS_PER_SM = 4


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

    M, K = a.shape
    N = b.shape[1]
    interpreted = _kernel_is_interpreted()
    # The interpreter truncates fp32 -> bfloat16 instead of rounding to
    # nearest-even (the GPU's cvt.rn); there the kernel writes fp32 and torch
    # performs the single final rounding.
    kernel_out = torch.float32 if interpreted else out_dtype
    out = torch.empty((M, N), dtype=kernel_out, device=a.device)
    n = num_leaves(K)
    depth = merge_schedule(n)[1]
    tiles_m = -(-M // tk.BLOCK_M)
    tiles_n = -(-N // tk.BLOCK_N)
    n_tiles = tiles_m * tiles_n
    if a.device.type == "cuda":
        sms = torch.cuda.get_device_properties(a.device).multi_processor_count
        n_prog = min(n_tiles, _PROGRAMS_PER_SM * sms)
    else:
        n_prog = min(n_tiles, 4)
    # The grid size only changes which program computes a tile, not how.
    scratch = torch.empty(n_prog * depth * tk.BLOCK_M * tk.BLOCK_N, dtype=torch.float32,
                          device=a.device)
    tk.det_mm_kernel[(n_prog,)](
        a, b, out, schedule_tensor(n, a.device), scratch,
        M, N, K, n, n_tiles, tiles_n, depth,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
        BM=tk.BLOCK_M, BN=tk.BLOCK_N, LEAF=LEAF, INTERPRET=interpreted, num_warps=tk.NUM_WARPS,
        enable_fp_fusion=False,  # no mul+add contraction outside the leaf dot
    )
    return out.to(out_dtype)
