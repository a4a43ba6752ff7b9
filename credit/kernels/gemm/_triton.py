"""Triton backend: launcher and availability (kernel in ``_triton_kernel.py``).

Runs on CUDA GPUs with compute capability 8.0+.  With ``TRITON_INTERPRET=1``
set before the first use of this backend, Triton's interpreter runs the same
kernel on CPU tensors (slow; used by the test suite on machines without GPU).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from ._tree import LEAF, left_leaves, num_leaves


def _interpret_env() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


@functools.cache
def _kernel_is_interpreted() -> bool:
    """Whether the kernel was defined for Triton's interpreter (fixed once it is imported)."""
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


def mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, whole: bool = False) -> torch.Tensor:
    """``a @ b`` with the Triton kernel; inputs already validated. `whole`: K is a reduction
    that no tensor-parallel split cuts, computed as one chain (no tree; see docs/kernels.md)."""
    from . import _triton_kernel as tk

    interpreted = _kernel_is_interpreted()
    # The interpreter truncates fp32 -> bfloat16 instead of rounding to nearest-even (the
    # GPU's cvt.rn); there the kernel writes fp32 and torch performs the single rounding.
    kernel_out = torch.float32 if interpreted else out_dtype
    if whole:
        return _chain_mm(a, b, kernel_out, tk).to(out_dtype)
    return _tree_mm(a, b, kernel_out, tk, _depth_limits(a.device, a.dtype)).to(out_dtype)


def _chain_mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, tk) -> torch.Tensor:
    M, K = a.shape
    N = b.shape[1]
    bm, bn, bk, warps, stages = tk.CHAIN_TILES[_dtype_name(a.dtype)]
    if _kernel_is_interpreted():  # its explicit BM x BK x BN product must stay under 2**20 elements
        bk = 16
    out = torch.empty((M, N), dtype=out_dtype, device=a.device)
    tk.det_chain_kernel[(-(-M // bm) * -(-N // bn),)](
        a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        out.stride(0), out.stride(1), BM=bm, BN=bn, BK=bk, GROUP=tk.GROUP_M, STAGES=stages,
        INTERPRET=_kernel_is_interpreted(), num_warps=warps,
        enable_fp_fusion=False,  # no mul+add contraction outside the dot
    )
    return out


@functools.lru_cache(maxsize=16)
def _depth_limits(device: torch.device, dtype: torch.dtype) -> tuple[int, int]:
    """`max_depth` of a whole tree and of a subtree on `device` (a host query a call saved:
    a step makes hundreds of these calls and a GPU step at small sizes waits on the host)."""
    from . import _triton_kernel as tk

    major = torch.cuda.get_device_capability(device)[0] if device.type == "cuda" else 9
    return tk.max_depth(_dtype_name(dtype), major, False), tk.max_depth(_dtype_name(dtype), major, True)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tree_depth(n: int) -> int:
    """Height of ``T(n)``: levels of partial tiles a kernel holds for ``n`` leaves."""
    return (n - 1).bit_length()


MIN_SUBTREE_LEAVES = 8
"""Leaves a program of a split launch runs at least (a shorter one is mostly prologue)."""
MAX_SPLIT = 8
"""Tree levels a launch splits for occupancy at most (2**8 partial outputs)."""
PARTIALS_BYTES = 64 << 20
"""Largest buffer of subtree sums a launch writes; a taller split halves K on the host first."""


@functools.lru_cache(maxsize=8)
def _programs_wanted(device: torch.device) -> int:
    """Programs a launch should have to keep the device busy: two per SM (a 64 x 64 tile
    over 8 warps), or 1 where there is no SM count (the interpreter: never split for it)."""
    if device.type != "cuda":
        return 1
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


def split_levels(n: int, tiles: int, depth_limits: tuple[int, int], programs: int) -> int:
    """Levels of T(n) to run as separate subtrees: enough that the tallest subtree fits the
    kernel's registers (`depth_limits`: the levels a program holds of a whole tree, of a
    subtree; see `max_depth`), then more while the launch has fewer than
    `programs` programs (tiles x subtrees) and each subtree keeps MIN_SUBTREE_LEAVES
    leaves: a weight gradient's long K over few output tiles (K = 320000 rows into a
    128 x 128 dW is 4 tiles) would otherwise run on 4 of the GPU's SMs. The bits do not
    depend on it: every split is of the same tree."""
    whole, subtree = depth_limits
    levels = 0
    if tree_depth(n) > whole:
        levels = 1
        while tree_depth(-(-n // (1 << levels))) > subtree:
            levels += 1
    while (tiles << levels) < programs and levels < MAX_SPLIT \
            and n >> (levels + 1) >= MIN_SUBTREE_LEAVES:
        levels += 1
    return levels


def _tree_mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, tk,
             limits: tuple[int, int]) -> torch.Tensor:
    M, K = a.shape
    N = b.shape[1]
    n = num_leaves(K)
    bm, bn, warps, stages = tk.TILES[_dtype_name(a.dtype)]
    tiles = -(-M // bm) * -(-N // bn)
    levels = split_levels(n, tiles, limits, _programs_wanted(a.device))
    if levels > 1 and (M * N * 4 << levels) > PARTIALS_BYTES:
        # a tall tree over a large output: T(n) = T(ceil(n/2)) + T(floor(n/2)) on the host,
        # each half exactly the subtree over its leaves, so two smaller buffers at a time
        split = left_leaves(n) * LEAF
        left = _tree_mm(a[:, :split], b[:split], torch.float32, tk, limits)
        right = _tree_mm(a[:, split:], b[split:], torch.float32, tk, limits)
        return (left + right).to(out_dtype)
    # a split launch: each subtree's fp32 sum in its own slice, then the tree's top levels
    # added left + right in fp32, T(n) = T(ceil(n/2)) + T(floor(n/2)) (no rounding between)
    out = torch.empty((1 << levels, M, N), dtype=out_dtype if levels == 0 else torch.float32,
                      device=a.device)
    depth = tree_depth(-(-n // (1 << levels)))
    tk.det_mm_kernel[(tiles, 1 << levels)](
        a, b, out, M, N, K, n,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(1), out.stride(2),
        out.stride(0),
        SPLIT=levels, DEPTH=depth, EVEN_K=K % LEAF == 0, BM=bm, BN=bn, LEAF=LEAF,
        GROUP=tk.GROUP_M, STAGES=stages, INTERPRET=_kernel_is_interpreted(), num_warps=warps,
        enable_fp_fusion=False,  # no mul+add contraction outside the leaf dot
    )
    while out.shape[0] > 1:  # node z's children are 2z (left) and 2z + 1 (right)
        pairs = out.view(out.shape[0] // 2, 2, M, N)
        out = pairs[:, 0] + pairs[:, 1]
    return out[0].to(out_dtype)
