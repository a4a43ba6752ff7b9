"""Design study for the deterministic GEMM on tensor cores: leaves that are long MMA chains.

Today's Triton kernel (`credit/kernels/gemm/_triton_kernel.py`) computes each 32-element leaf
of the K tree as one `tl.dot` into a fresh accumulator on a 64 x 64 tile: the MMA pipeline is
drained every 32 K and the tile is small, so it runs at about a tenth of cuBLAS. This script
measures the candidate that replaces it, before the contract changes: a leaf of `LEAF_K`
consecutive K elements is a chain of `tl.dot(a, b, acc)` over `BK`-wide chunks (one
accumulator, the MMA pipeline kept full), and the leaves are combined by the same tree
`T(n) = T(ceil(n/2)) + T(floor(n/2))`, its partial tiles held in registers as today. A leaf
length that divides K/8 keeps every 2-, 4- and 8-way tensor-parallel shard boundary a leaf
boundary, so the pairwise property holds with the global K's leaf length.

For each tile configuration and leaf length it prints, on the GPU it runs on: the registers
and spills the compiler reports, time against `torch.matmul` (samples interleaved, the median
of per-pair ratios, as `benchmarks/gemm.py`), and bitwise checks of the properties the
contract needs: rows independent of the batch (a row alone, a slice of rows), columns
independent of N, and K split into 2, 4 and 8 equal parts whose fp32 results added pairwise
equal the whole. Today's kernel is timed beside it.

    PYTHONPATH=.:benchmarks python benchmarks/gemm_chain_study.py --out results.md   # on a GPU
    TRITON_INTERPRET=1 PYTHONPATH=.:benchmarks python benchmarks/gemm_chain_study.py --dry-run

The dry run checks the tree and chain logic on CPU tensors at tiny sizes under Triton's
interpreter (where a chunk's products are an explicit multiply and sum, as in the kernel it
studies); it times nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from credit.kernels.gemm import det_mm
from credit.kernels.gemm._triton_kernel import GROUP_M, _leaf_path, _level, _tile_of

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _climb(x, s1, s2, s3, s4, s5, s6, leaf, n_leaves, DEPTH: tl.constexpr):
    """The K tree after leaf `leaf`: add held left siblings, hold the result for its right one."""
    depth, run = _leaf_path(leaf, n_leaves, DEPTH)
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
    return x, s1, s2, s3, s4, s5, s6


@triton.jit
def chain_mm_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, n_leaves,
    s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
    LEAF_K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    DEPTH: tl.constexpr, STAGES: tl.constexpr, FLAT: tl.constexpr, IS_INTERPRET: tl.constexpr,
    GROUP: tl.constexpr,
):
    tile_m, tile_n = _tile_of(tl.program_id(0), M, N, BM, BN, GROUP)
    rm = tile_m * BM + tl.arange(0, BM)
    rn = tile_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    mask_m = rm[:, None] < M
    mask_n = rn[None, :] < N
    a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * s_am + rk[None, :] * s_ak
    b_ptrs = b_ptr + rk[:, None] * s_bk + rn.to(tl.int64)[None, :] * s_bn
    c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * s_cm + rn.to(tl.int64)[None, :] * s_cn
    CHUNKS: tl.constexpr = LEAF_K // BK

    zero = tl.zeros((BM, BN), dtype=tl.float32)
    s1 = zero
    s2 = zero
    s3 = zero
    s4 = zero
    s5 = zero
    s6 = zero
    acc = zero
    if FLAT:  # one pipelined loop over every chunk; the tree climbs at each leaf's last chunk
        for c in tl.range(0, n_leaves * CHUNKS, num_stages=STAGES):
            k0 = c * BK
            a = tl.load(a_ptrs + k0 * s_ak, mask=mask_m & (rk[None, :] < K - k0), other=0.0)
            b = tl.load(b_ptrs + k0 * s_bk, mask=(rk[:, None] < K - k0) & mask_n, other=0.0)
            if IS_INTERPRET:
                acc = acc + tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
            else:
                acc = tl.dot(a, b, acc, input_precision="ieee", out_dtype=tl.float32)
            if c % CHUNKS == CHUNKS - 1:
                leaf = c // CHUNKS
                x, s1, s2, s3, s4, s5, s6 = _climb(acc, s1, s2, s3, s4, s5, s6, leaf, n_leaves, DEPTH)
                acc = zero
                if leaf == n_leaves - 1:  # x is the root
                    tl.store(c_ptrs, x.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)
    else:  # a loop per leaf, each pipelined on its own
        for leaf in range(0, n_leaves):
            acc = zero
            for j in tl.range(0, CHUNKS, num_stages=STAGES):
                k0 = leaf * LEAF_K + j * BK
                a = tl.load(a_ptrs + k0 * s_ak, mask=mask_m & (rk[None, :] < K - k0), other=0.0)
                b = tl.load(b_ptrs + k0 * s_bk, mask=(rk[:, None] < K - k0) & mask_n, other=0.0)
                if IS_INTERPRET:
                    acc = acc + tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
                else:
                    acc = tl.dot(a, b, acc, input_precision="ieee", out_dtype=tl.float32)
            x, s1, s2, s3, s4, s5, s6 = _climb(acc, s1, s2, s3, s4, s5, s6, leaf, n_leaves, DEPTH)
            if leaf == n_leaves - 1:
                tl.store(c_ptrs, x.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)


LAST_COMPILE: dict[str, object] = {}


def chain_mm(a: torch.Tensor, b: torch.Tensor, leaf_k: int, cfg: tuple, out_dtype=None) -> torch.Tensor:
    """a @ b with leaves of `leaf_k` K elements; cfg = (BM, BN, BK, warps, stages, flat)."""
    bm, bn, bk, warps, stages, flat = cfg
    bk = min(bk, leaf_k)  # a chunk never spans two leaves
    M, K = a.shape
    N = b.shape[1]
    n = -(-K // leaf_k)
    depth = (n - 1).bit_length()
    if depth > 6:
        raise ValueError(f"K={K} at leaf {leaf_k} needs {depth} tree levels; the study holds 6")
    out_dtype = out_dtype or a.dtype
    kernel_out = torch.float32 if INTERPRET else out_dtype
    c = torch.empty((M, N), dtype=kernel_out, device=a.device)
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    compiled = chain_mm_kernel[grid](
        a, b, c, M, N, K, n, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        c.stride(0), c.stride(1), LEAF_K=leaf_k, BM=bm, BN=bn, BK=bk, DEPTH=depth,
        STAGES=stages, FLAT=flat, IS_INTERPRET=INTERPRET, GROUP=GROUP_M, num_warps=warps,
        enable_fp_fusion=False)
    LAST_COMPILE["kernel"] = compiled
    return c.to(out_dtype)


def tree_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    if len(parts) == 1:
        return parts[0]
    h = (len(parts) + 1) // 2
    return tree_sum(parts[:h]) + tree_sum(parts[h:])


def check_bits(a: torch.Tensor, b: torch.Tensor, leaf_k: int, cfg: tuple) -> list[str]:
    """The contract's properties, bitwise; returns the failures (empty: all hold)."""
    fails = []
    M, K = a.shape
    N = b.shape[1]
    full = chain_mm(a, b, leaf_k, cfg)
    full32 = chain_mm(a, b, leaf_k, cfg, torch.float32)
    rows = [min(5, M - 1)]
    if not torch.equal(chain_mm(a[rows[0]:rows[0] + 1], b, leaf_k, cfg), full[rows[0]:rows[0] + 1]):
        fails.append("a row alone")
    lo, hi = M // 3, min(M, M // 3 + 77)
    if not torch.equal(chain_mm(a[lo:hi], b, leaf_k, cfg), full[lo:hi]):
        fails.append(f"rows {lo}:{hi}")
    nn = min(N, 96)
    if not torch.equal(chain_mm(a, b[:, :nn].contiguous(), leaf_k, cfg), full[:, :nn]):
        fails.append(f"first {nn} columns")
    for p in (2, 4, 8):
        if K % (p * leaf_k):
            continue
        w = K // p
        parts = [chain_mm(a[:, i * w:(i + 1) * w], b[i * w:(i + 1) * w], leaf_k, cfg, torch.float32)
                 for i in range(p)]
        if not torch.equal(tree_sum(parts), full32):
            fails.append(f"K split {p} ways")
    ref = a.double() @ b.double()
    # the fp32 sum's bound with a chain of LEAF_K and the tree's depth (docs/kernels.md's form)
    m = leaf_k + (-(-K // leaf_k) - 1).bit_length()
    u = 2.0 ** -24
    gamma = m * u / (1 - m * u)
    bound = gamma * (a.double().abs() @ b.double().abs())
    if not bool(((full32.double() - ref).abs() <= bound).all()):
        fails.append("fp32 error bound")
    return fails


def calls_per_sample(fn, device: torch.device, min_time: float) -> int:
    """Calls of `fn` that last about `min_time` seconds (after one warm-up call)."""
    fn()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    return max(1, int(min_time / max(time.perf_counter() - t0, 1e-6)))


def interleaved(fns: list, device: torch.device, repeat: int, min_time: float) -> list[float]:
    """Median seconds per call of each fn, samples taken in turn (f0, f1, ..., f0, f1, ...)."""
    calls = [calls_per_sample(f, device, min_time) for f in fns]
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for f, n, out in zip(fns, calls, samples):
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            torch.cuda.synchronize(device)
            out.append((time.perf_counter() - t0) / n)
    return [sorted(s)[len(s) // 2] for s in samples]


BF16_CONFIGS = [  # (BM, BN, BK, warps, stages, flat); ptxas for sm_90a: no spills at depth <= 3
    (128, 64, 64, 8, 3, True), (128, 64, 64, 8, 4, True), (128, 64, 128, 8, 3, True),
    (128, 64, 64, 8, 4, False), (64, 64, 64, 4, 4, True), (64, 128, 64, 8, 3, True),
    (128, 128, 64, 8, 3, True),  # spills (700 bytes at depth 3): what the spills cost
]
FP32_CONFIGS = [(64, 64, 32, 4, 3, True), (64, 64, 32, 8, 3, True), (128, 64, 32, 8, 3, True),
                (64, 128, 32, 8, 3, True)]
SINGLE_CHAIN_CONFIGS = {  # no spills (sm_90a)
    "bfloat16": [(128, 256, 64, 8, 3, False), (128, 256, 64, 8, 4, False), (128, 128, 64, 4, 3, False),
                 (128, 128, 64, 8, 4, False)],
    "float32": [(128, 128, 32, 8, 3, False), (128, 64, 32, 8, 3, False), (64, 64, 32, 8, 3, False)],
}
LEAVES = {"bfloat16": [256, 512, 1024], "float32": [256, 512]}
SHAPES = [(4096, 4096, 4096), (20000, 512, 2048), (20000, 2048, 512), (80000, 256, 1024),
          (80000, 1024, 256), (5000, 1024, 4096), (320000, 128, 512)]


def describe(cfg: tuple) -> str:
    return f"{cfg[0]}x{cfg[1]}x{cfg[2]}, {cfg[3]} warps, {cfg[4]} stages, {'flat' if cfg[5] else 'nested'}"


def leaf_for(K: int, cap: int = 512) -> int:
    """The longest leaf of 32 * 2^j elements (at most `cap`) that divides K / 8, else 32."""
    leaf = 32
    while leaf * 2 <= cap and K % (8 * leaf * 2) == 0:
        leaf *= 2
    return leaf


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny shapes, no timing")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--min-time", type=float, default=0.02)
    p.add_argument("--out", type=Path)
    p.add_argument("--single-chain", action="store_true",
                   help="only one chain over the whole K (no tree: a reduction no split cuts), bf16")
    args = p.parse_args(argv)
    lines: list[str] = []

    def say(line: str = "") -> None:
        lines.append(line)
        print(line, flush=True)
        if args.out:
            args.out.write_text("\n".join(lines) + "\n")

    if args.dry_run:
        if not INTERPRET:
            raise SystemExit("error: --dry-run needs TRITON_INTERPRET=1 set before the start")
        g = torch.Generator().manual_seed(0)
        a = torch.randn(40, 256, generator=g).to(torch.bfloat16)
        b = torch.randn(256, 48, generator=g).to(torch.bfloat16)
        cfg_small = (16, 16, 16, 4, 1, True)
        for flat in (True, False):
            for leaf in (16, 32, 64):
                cfg = (*cfg_small[:5], flat)
                fails = check_bits(a, b, leaf, cfg)
                say(f"dry run flat={flat} leaf={leaf}: {'all properties hold' if not fails else fails}")
                if fails:
                    return 1
        return 0

    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    name = torch.cuda.get_device_name(device)
    say(f"# Long-chain leaves for the deterministic GEMM on {name}")
    say(f"torch {torch.__version__}, triton {triton.__version__}; speed = t(torch.matmul) / t(candidate), "
        "medians of interleaved samples; `det today` = the current det_mm Triton kernel.")
    g = torch.Generator().manual_seed(0)

    def operands(shape, dtype):
        M, K, N = shape
        return (torch.randn(M, K, generator=g).to(dtype=dtype, device=device),
                torch.randn(K, N, generator=g).to(dtype=dtype, device=device))

    for dtype in (torch.bfloat16, torch.float32) if args.single_chain else ():
        say(f"\n## {str(dtype)[6:]}, one chain over the whole K (leaf = K, no tree)")
        say("| M x K x N | config | regs | spills | torch ms | det today ms | chain ms | speed | today's speed | bits |")
        say("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for shape in SHAPES:
            a, b = operands(shape, dtype)
            for cfg in SINGLE_CHAIN_CONFIGS[str(dtype)[6:]]:
                leaf = -(-shape[1] // cfg[2]) * cfg[2]
                try:
                    chain_mm(a, b, leaf, cfg)
                    k = LAST_COMPILE["kernel"]
                    regs, spills = getattr(k, "n_regs", "?"), getattr(k, "n_spills", "?")
                    ms_ref, ms_today, ms = [t * 1e3 for t in interleaved(
                        [lambda: torch.matmul(a, b), lambda: det_mm(a, b, backend="triton"),
                         lambda: chain_mm(a, b, leaf, cfg)], device, args.repeat, args.min_time)]
                    fails = check_bits(a, b, leaf, cfg) if shape[0] <= 20000 else None
                except Exception as error:
                    say(f"| {'x'.join(map(str, shape))} | {describe(cfg)} | failed: {type(error).__name__}: "
                        f"{str(error)[-160:]} | | | | | | | |")
                    continue
                bits = "not checked" if fails is None else ("ok" if not fails else ", ".join(fails))
                say(f"| {'x'.join(map(str, shape))} | {describe(cfg)} | {regs} | {spills} | {ms_ref:.3f} "
                    f"| {ms_today:.3f} | {ms:.3f} | {ms_ref / ms:.2f} | {ms_ref / ms_today:.2f} | {bits} |")
    if args.single_chain:
        return 0
    for dtype, configs in ((torch.bfloat16, BF16_CONFIGS), (torch.float32, FP32_CONFIGS)):
        name = str(dtype)[6:]
        a, b = operands(SHAPES[0], dtype)
        say(f"\n## {name} 4096^3: every configuration and leaf length")
        say("| BM x BN x BK, warps, stages, loop | leaf | regs | spills | ms | speed |")
        say("| --- | --- | --- | --- | --- | --- |")
        ref_ms, today_ms = [t * 1e3 for t in interleaved(
            [lambda: torch.matmul(a, b), lambda: det_mm(a, b, backend="triton")], device, args.repeat,
            args.min_time)]
        say(f"| torch.matmul | | | | {ref_ms:.3f} | 1.00 |")
        say(f"| det today (64x64, leaf 32, one dot a leaf) | 32 | | | {today_ms:.3f} | {ref_ms / today_ms:.2f} |")
        timings = []
        for cfg in configs:
            for leaf in LEAVES[name]:
                try:
                    chain_mm(a, b, leaf, cfg)
                    k = LAST_COMPILE["kernel"]
                    regs, spills = getattr(k, "n_regs", "?"), getattr(k, "n_spills", "?")
                    ms_ref, ms = [t * 1e3 for t in interleaved(
                        [lambda: torch.matmul(a, b), lambda: chain_mm(a, b, leaf, cfg)],
                        device, args.repeat, args.min_time)]
                except Exception as error:  # a configuration that does not compile is a finding
                    say(f"| {describe(cfg)} | {leaf} | | | failed: {type(error).__name__}: {str(error)[-160:]} | |")
                    continue
                timings.append((ms_ref / ms, cfg, leaf))
                say(f"| {describe(cfg)} | {leaf} | {regs} | {spills} | {ms:.3f} | {ms_ref / ms:.2f} |")
        timings.sort(key=lambda t: -t[0])
        say(f"\nBits of the three fastest at 4096^3 (a row alone, a slice of rows, 96 columns, K split "
            "2/4/8 ways added pairwise, the fp32 error bound):")
        for _, cfg, leaf in timings[:3]:
            fails = check_bits(a, b, leaf, cfg)
            say(f"- {describe(cfg)}, leaf {leaf}: {'all hold' if not fails else 'FAILED: ' + ', '.join(fails)}")
        top = list(dict.fromkeys(cfg for _, cfg, _ in timings[:6]))[:2]
        say(f"\n## {name} projection shapes: the two fastest configurations, leaf = leaf_for(K) "
            "(the longest 32 * 2^j <= 512 dividing K / 8)")
        say("| M x K x N | leaf | config | torch ms | det today ms | candidate ms | speed | today's speed | bits |")
        say("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for shape in SHAPES[1:]:
            a, b = operands(shape, dtype)
            leaf = leaf_for(shape[1])
            for i, cfg in enumerate(top):
                try:
                    ms_ref, ms_today, ms = [t * 1e3 for t in interleaved(
                        [lambda: torch.matmul(a, b), lambda: det_mm(a, b, backend="triton"),
                         lambda: chain_mm(a, b, leaf, cfg)], device, args.repeat, args.min_time)]
                    fails = check_bits(a, b, leaf, cfg) if i == 0 else None
                except Exception as error:
                    say(f"| {'x'.join(map(str, shape))} | {leaf} | {describe(cfg)} | failed: "
                        f"{type(error).__name__}: {str(error)[-160:]} | | | | | |")
                    continue
                bits = "not checked" if fails is None else ("ok" if not fails else ", ".join(fails))
                say(f"| {'x'.join(map(str, shape))} | {leaf} | {describe(cfg)} | {ms_ref:.3f} | {ms_today:.3f} "
                    f"| {ms:.3f} | {ms_ref / ms:.2f} | {ms_ref / ms_today:.2f} | {bits} |")
        del a, b
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
