"""Triton kernel for the deterministic GEMM (imported lazily: importing it imports triton,
and ``TRITON_INTERPRET`` is read when the kernel is defined).

A program owns one BM x BN output tile and one subtree of the K tree: the whole tree, or
one of the ``2**SPLIT`` subtrees at level ``SPLIT`` (``T(n)`` halves at ``ceil(n/2)``, so
a node at that level is found by walking ``SPLIT`` halvings from the root, left for a 0 bit
of its index, right for a 1). The second grid axis is the subtree index; a split launch
writes each subtree's fp32 sum to its own slice of the output (``s_cz`` apart) and the
launcher adds the slices level by level, left + right, which is the tree's top. A leaf is
one ``tl.dot`` over 32 K elements into a fresh fp32 accumulator: tensor cores for
bf16/fp16, IEEE fp32 (no TF32) for fp32 inputs.

The partial tiles live in registers, one per tree level (``s1`` .. ``s8``), not in memory:
after leaf ``i``, whose node sits at depth ``d`` and ends a run of ``m`` right children,
the tile climbs, ``x = s_t + x`` (left + right) for the ``m`` levels ``t = d, d-1, ...``,
and is left in ``s_{d-m}`` for its right sibling to find. Each level is an explicit
variable because registers cannot be indexed at run time; ``DEPTH`` (the tallest subtree's
height, a constexpr) drops the unused ones. ``(d, m)`` come from a few scalar operations on
``i`` and the subtree's leaf count.

Tiles are fixed per dtype (``TILES``), never per M, N or K: the instruction that computes a
leaf is then the same for every shape and every split, which the batch-, N- and K-split
invariance need. Programs are launched in groups of ``GROUP_M`` tile rows so neighbouring
programs share B panels in L2.

Under ``TRITON_INTERPRET=1`` (the CPU test path) a leaf is an explicit broadcast multiply and
sum over its 32 K elements instead of ``tl.dot``: the interpreter implements ``tl.dot`` with
numpy's BLAS matmul, whose rounding depends on a row's position inside the tile (and which
mishandles bfloat16). The tiling, masking, split and tree code is the same in both modes.
"""

import triton
import triton.language as tl

LEVELS = 8
"""Tree levels the kernel has registers for (``s1`` .. ``s8``)."""


def max_depth(dtype_name: str, major: int, split: bool = False) -> int:
    """Tree levels a program holds for this dtype on a GPU of compute capability `major`,
    whole tree or (`split`) one subtree of it: the most that compile without register spills
    (ptxas -v; pinned by the ahead-of-time compile test). 8 levels = 256 leaves = K 8192.
    fp32 on sm_80 holds 7 levels in 254 of its 255 registers; a subtree's bounds take one
    level of them."""
    if dtype_name != "float32" and major >= 9:
        return LEVELS
    return LEVELS - 2 if split and dtype_name == "float32" and major < 9 else LEVELS - 1

GROUP_M = 8

TILES = {
    # dtype: (BM, BN, num_warps, num_stages). 64 x 64 over 8 warps keeps a partial tile at
    # 16 fp32 registers per thread, so eight levels plus the leaf fit without spilling.
    "bfloat16": (64, 64, 8, 3),
    "float16": (64, 64, 8, 3),
    "float32": (64, 64, 8, 2),
}


@triton.jit
def _leaf_path(leaf, n_leaves, DEPTH: tl.constexpr):
    """(depth of leaf `leaf` in T(n_leaves), length of the run of right children that ends
    at it): walk down from the root, splitting each node at ceil(count / 2)."""
    lo = leaf * 0
    count = lo + n_leaves
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
def _subtree(z, n_leaves, SPLIT: tl.constexpr):
    """(first leaf, leaf count) of node `z` (left to right) at level SPLIT of T(n_leaves):
    SPLIT halvings from the root, the bits of z from the top choosing right (1) or left (0)."""
    first = z * 0
    count = first + n_leaves
    for t in tl.static_range(SPLIT):
        left = (count + 1) // 2
        right = ((z >> (SPLIT - 1 - t)) & 1) == 1
        first = tl.where(right, first + left, first)
        count = tl.where(right, count - left, left)
    return first, count


@triton.jit
def _level(x, s, t: tl.constexpr, depth, run):
    """Level `t` of the climb: add the held left sibling, or hold `x` for its right one."""
    if (t <= depth) & (t > depth - run):
        x = s + x
    if t == depth - run:
        s = x
    return x, s


@triton.jit
def _tile_of(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP: tl.constexpr):
    """(tile row, tile column) of program `pid` in grouped order: GROUP tile rows walk the tile
    columns together, so neighbouring programs share B panels in L2."""
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    per_group = GROUP * tiles_n
    first_m = (pid // per_group) * GROUP
    group_rows = tl.minimum(tiles_m - first_m, GROUP)
    return first_m + (pid % per_group) % group_rows, (pid % per_group) // group_rows


@triton.jit
def det_mm_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K, n_leaves,
    s_am, s_ak, s_bk, s_bn, s_cm, s_cn, s_cz,
    SPLIT: tl.constexpr, DEPTH: tl.constexpr, EVEN_K: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, LEAF: tl.constexpr, GROUP: tl.constexpr,
    STAGES: tl.constexpr, INTERPRET: tl.constexpr,
):
    z = tl.program_id(1)  # the subtree (0 when SPLIT == 0: the whole tree)
    tile_m, tile_n = _tile_of(tl.program_id(0), M, N, BM, BN, GROUP)
    first, count = _subtree(z, n_leaves, SPLIT)

    rm = tile_m * BM + tl.arange(0, BM)
    rn = tile_n * BN + tl.arange(0, BN)
    lk = tl.arange(0, LEAF)
    # the subtree's first leaf folded into the pointers, so the loop needs only its own k
    k_first = first.to(tl.int64) * LEAF
    a_rows = a_ptr + rm.to(tl.int64)[:, None] * s_am + k_first * s_ak
    b_cols = b_ptr + rn.to(tl.int64)[None, :] * s_bn + k_first * s_bk
    k_left = K - first * LEAF  # K past the subtree's first leaf
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
    for leaf in tl.range(0, count, num_stages=STAGES):
        rk = leaf * LEAF + lk
        rk64 = rk.to(tl.int64)
        if EVEN_K:
            a = tl.load(a_rows + rk64[None, :] * s_ak, mask=mask_m, other=0.0)
            b = tl.load(b_cols + rk64[:, None] * s_bk, mask=mask_n, other=0.0)
        else:  # the last leaf is zero-padded
            a = tl.load(a_rows + rk64[None, :] * s_ak, mask=mask_m & (rk[None, :] < k_left), other=0.0)
            b = tl.load(b_cols + rk64[:, None] * s_bk, mask=(rk[:, None] < k_left) & mask_n, other=0.0)
        if INTERPRET:  # see module docstring
            x = tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
        else:
            x = tl.dot(a, b, input_precision="ieee", out_dtype=tl.float32)
        depth, run = _leaf_path(leaf, count, DEPTH)
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
    # after the subtree's last leaf, x is its root
    c_tile = c_ptr + tl.program_id(1).to(tl.int64) * s_cz
    tl.store(c_tile + rm.to(tl.int64)[:, None] * s_cm + rn.to(tl.int64)[None, :] * s_cn,
             x.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)


CHAIN_TILES = {
    # dtype: (BM, BN, BK, num_warps, num_stages) of the one-chain kernel: no tree levels to
    # hold, so the tiles are cuBLAS-sized (no spills on sm_90a; pinned by the ahead-of-time test)
    "bfloat16": (128, 256, 64, 8, 3),
    "float16": (128, 256, 64, 8, 3),
    "float32": (128, 128, 32, 8, 3),
}


@triton.jit
def det_chain_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
    STAGES: tl.constexpr, INTERPRET: tl.constexpr,
):
    """One output tile as a single chain over the whole K: ``acc = dot(a_k, b_k, acc)`` for
    each BK-wide step in K order (a reduction no tensor-parallel split cuts, so no tree)."""
    tile_m, tile_n = _tile_of(tl.program_id(0), M, N, BM, BN, GROUP)
    rm = tile_m * BM + tl.arange(0, BM)
    rn = tile_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    mask_m = rm[:, None] < M
    mask_n = rn[None, :] < N
    a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * s_am + rk[None, :] * s_ak
    b_ptrs = b_ptr + rk[:, None] * s_bk + rn.to(tl.int64)[None, :] * s_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        a = tl.load(a_ptrs + k0 * s_ak, mask=mask_m & (rk[None, :] < K - k0), other=0.0)
        b = tl.load(b_ptrs + k0 * s_bk, mask=(rk[:, None] < K - k0) & mask_n, other=0.0)
        if INTERPRET:  # see module docstring
            acc = acc + tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
        else:
            acc = tl.dot(a, b, acc, input_precision="ieee", out_dtype=tl.float32)
    tl.store(c_ptr + rm.to(tl.int64)[:, None] * s_cm + rn.to(tl.int64)[None, :] * s_cn,
             acc.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)
