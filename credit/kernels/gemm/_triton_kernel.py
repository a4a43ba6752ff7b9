"""Triton kernel for the deterministic GEMM (imported lazily: importing it imports triton,
and ``TRITON_INTERPRET`` is read when the kernel is defined).

One program owns one BM x BN output tile and walks all K leaves for it; nothing is split
over K. A leaf is one ``tl.dot`` over 32 K elements into a fresh fp32 accumulator: tensor
cores for bf16/fp16, IEEE fp32 (no TF32) for fp32 inputs.

K is a compile-time constant, so the shape of the tree ``T(n)`` is too. The partial tiles
live in registers, one per tree level (``s1`` .. ``s8``), not in memory: after leaf ``i``,
whose node sits at depth ``d`` and ends a run of ``m`` right children, the tile climbs,
``x = s_t + x`` (left + right) for the ``m`` levels ``t = d, d-1, ...``, and is left in
``s_{d-m}`` for its right sibling to find. Each level is an explicit variable because
registers cannot be indexed at run time; ``DEPTH`` (the tree's height, a constexpr) drops
the unused ones. ``(d, m)`` come from a few scalar operations on ``i`` and the constexpr
leaf count. The launcher splits trees taller than ``max_depth`` at their top levels (each
half is exactly a subtree) and adds the halves in fp32.

Tiles are fixed per dtype (``TILES``), never per M, N or K: the instruction that computes a
leaf is then the same for every shape, which the batch-, N- and K-split invariance need.
Programs are launched in groups of ``GROUP_M`` tile rows so neighbouring programs share
B panels in L2.

Under ``TRITON_INTERPRET=1`` (the CPU test path) a leaf is an explicit broadcast multiply and
sum over its 32 K elements instead of ``tl.dot``: the interpreter implements ``tl.dot`` with
numpy's BLAS matmul, whose rounding depends on a row's position inside the tile (and which
mishandles bfloat16). The tiling, masking and tree code is the same in both modes.
"""

import triton
import triton.language as tl

LEVELS = 8
"""Tree levels the kernel has registers for (``s1`` .. ``s8``)."""


def max_depth(dtype_name: str, major: int) -> int:
    """Tree levels one launch holds for this dtype on a GPU of compute capability `major`:
    the most that compile without register spills (ptxas -v; pinned by the ahead-of-time
    compile test). 8 levels = 256 leaves = K 8192."""
    return LEVELS if dtype_name != "float32" and major >= 9 else LEVELS - 1

GROUP_M = 8

TILES = {
    # dtype: (BM, BN, num_warps, num_stages). 64 x 64 over 8 warps keeps a partial tile at
    # 16 fp32 registers per thread, so eight levels plus the leaf fit without spilling.
    "bfloat16": (64, 64, 8, 3),
    "float16": (64, 64, 8, 3),
    "float32": (64, 64, 8, 2),
}


@triton.jit
def _leaf_path(leaf, N_LEAVES: tl.constexpr, DEPTH: tl.constexpr):
    """(depth of leaf `leaf` in T(N_LEAVES), length of the run of right children that ends
    at it): walk down from the root, splitting each node at ceil(count / 2)."""
    lo = leaf * 0
    count = lo + N_LEAVES
    depth = lo
    run = lo
    for t in tl.static_range(1, DEPTH + 1):
        split = count > 1
        left = (count + 1) // 2
        right = split & (leaf >= lo + left)
        lo = tl.where(right, lo + left, lo)
        count = tl.where(split, tl.where(right, count - left, left), count)
        depth = tl.where(split, t, depth)
        run = tl.where(split, tl.where(right, run + 1, 0), run)
    return depth, run


@triton.jit
def _level(x, s, t: tl.constexpr, depth, run):
    """Level `t` of the climb: add the held left sibling, or hold `x` for its right one."""
    if (t <= depth) & (t > depth - run):
        x = s + x
    if t == depth - run:
        s = x
    return x, s


@triton.jit
def det_mm_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N,
    s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
    K: tl.constexpr, N_LEAVES: tl.constexpr, DEPTH: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, LEAF: tl.constexpr, GROUP: tl.constexpr,
    STAGES: tl.constexpr, INTERPRET: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    # grouped order: GROUP tile rows walk the tile columns together (B panels stay in L2)
    per_group = GROUP * tiles_n
    first_m = (pid // per_group) * GROUP
    group_rows = tl.minimum(tiles_m - first_m, GROUP)
    tile_m = first_m + (pid % per_group) % group_rows
    tile_n = (pid % per_group) // group_rows

    rm = tile_m * BM + tl.arange(0, BM)
    rn = tile_n * BN + tl.arange(0, BN)
    lk = tl.arange(0, LEAF)
    a_rows = a_ptr + rm.to(tl.int64)[:, None] * s_am
    b_cols = b_ptr + rn.to(tl.int64)[None, :] * s_bn
    mask_m = rm[:, None] < M
    mask_n = rn[None, :] < N

    zero = tl.zeros((BM, BN), dtype=tl.float32)
    s1 = zero
    s2 = zero
    s3 = zero
    s4 = zero
    s5 = zero
    s6 = zero
    s7 = zero
    s8 = zero
    x = zero
    for leaf in tl.range(0, N_LEAVES, num_stages=STAGES):
        rk = leaf * LEAF + lk
        rk64 = rk.to(tl.int64)
        if K % LEAF == 0:
            a = tl.load(a_rows + rk64[None, :] * s_ak, mask=mask_m, other=0.0)
            b = tl.load(b_cols + rk64[:, None] * s_bk, mask=mask_n, other=0.0)
        else:  # the last leaf is zero-padded
            a = tl.load(a_rows + rk64[None, :] * s_ak, mask=mask_m & (rk[None, :] < K), other=0.0)
            b = tl.load(b_cols + rk64[:, None] * s_bk, mask=(rk[:, None] < K) & mask_n, other=0.0)
        if INTERPRET:  # see module docstring
            x = tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
        else:
            x = tl.dot(a, b, input_precision="ieee", out_dtype=tl.float32)
        depth, run = _leaf_path(leaf, N_LEAVES, DEPTH)
        if DEPTH >= 8:
            x, s8 = _level(x, s8, 8, depth, run)
        if DEPTH >= 7:
            x, s7 = _level(x, s7, 7, depth, run)
        if DEPTH >= 6:
            x, s6 = _level(x, s6, 6, depth, run)
        if DEPTH >= 5:
            x, s5 = _level(x, s5, 5, depth, run)
        if DEPTH >= 4:
            x, s4 = _level(x, s4, 4, depth, run)
        if DEPTH >= 3:
            x, s3 = _level(x, s3, 3, depth, run)
        if DEPTH >= 2:
            x, s2 = _level(x, s2, 2, depth, run)
        if DEPTH >= 1:
            x, s1 = _level(x, s1, 1, depth, run)
    # after the last leaf, x is the root
    tl.store(c_ptr + rm.to(tl.int64)[:, None] * s_cm + rn.to(tl.int64)[None, :] * s_cn,
             x.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)
