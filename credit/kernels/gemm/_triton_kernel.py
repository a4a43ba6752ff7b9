"""Triton kernel for the deterministic GEMM (imported lazily: importing it
imports triton, and ``TRITON_INTERPRET`` is read when the kernel is defined).

One program owns whole BM x BN output tiles (persistent loop over tiles) and
walks all K leaves for each; nothing is split over K.  A leaf is a single
``tl.dot`` over 32 K elements with a fresh fp32 accumulator and IEEE fp32
inputs (no TF32).  Leaf sums are combined by the fixed tree through a stack of
partial tiles kept in a per-program global scratch buffer, driven by the
``merges`` schedule from ``_tree.py``.

Under ``TRITON_INTERPRET=1`` (the CPU test path) the launcher sets
``INTERPRET`` and a leaf is evaluated as an explicit broadcast multiply and sum
over its 32 K elements instead of ``tl.dot``: the interpreter implements
``tl.dot`` with numpy's BLAS matmul, whose rounding depends on a row's position
inside the tile (and which mishandles bfloat16).  The tiling, masking, tree
and stack logic is the same code in both modes.
"""

import triton
import triton.language as tl

BLOCK_M = 64
BLOCK_N = 64
NUM_WARPS = 4


@triton.jit
def det_mm_kernel(
    a_ptr, b_ptr, c_ptr, merges_ptr, scratch_ptr,
    M, N, K, n_leaves, n_tiles, tiles_n, depth,
    s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
    BM: tl.constexpr, BN: tl.constexpr, LEAF: tl.constexpr, INTERPRET: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lm = tl.arange(0, BM)
    ln = tl.arange(0, BN)
    lk = tl.arange(0, LEAF)
    slot = BM * BN
    stack = scratch_ptr + pid.to(tl.int64) * depth * slot + lm[:, None] * BN + ln[None, :]
    for tile in range(pid, n_tiles, nprog):
        rm = (tile // tiles_n) * BM + lm
        rn = (tile % tiles_n) * BN + ln
        rm64 = rm.to(tl.int64)
        rn64 = rn.to(tl.int64)
        top = 0
        part = tl.zeros((BM, BN), dtype=tl.float32)
        for leaf in range(n_leaves):
            rk = leaf * LEAF + lk
            rk64 = rk.to(tl.int64)
            a = tl.load(a_ptr + rm64[:, None] * s_am + rk64[None, :] * s_ak,
                        mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            b = tl.load(b_ptr + rk64[:, None] * s_bk + rn64[None, :] * s_bn,
                        mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
            if INTERPRET:  # see module docstring
                part = tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :],
                              axis=1)
            else:
                part = tl.dot(a, b, input_precision="ieee", out_dtype=tl.float32)
            n_merge = tl.load(merges_ptr + leaf)
            # Make earlier pushes (other threads' stores) visible.
            tl.debug_barrier()
            for _ in range(n_merge):
                top -= 1
                part = tl.load(stack + top * slot) + part  # left + right
            # Every pop must have read its slot before it is overwritten.
            tl.debug_barrier()
            tl.store(stack + top * slot, part)
            top += 1
        tl.store(c_ptr + rm64[:, None] * s_cm + rn64[None, :] * s_cn,
                 part.to(c_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))
        # The next tile reuses the scratch slots.
        tl.debug_barrier()
