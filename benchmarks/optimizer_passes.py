#!/usr/bin/env python3
"""Deterministic mode's per-parameter passes: fused CPU kernels against the list-wide torch ops.

Times, on the same tensors and interleaved (fused, list-wide, fused, ...), the AdamW update of
`ElementwiseAdamW` (one fused pass per tensor vs its `_foreach_*` ops) and the exact gradient
norm's integer square sums (`credit.parallel.exact_norm`: one fused pass vs torch's bit-field
ops and bincounts). Both sides give the same bits (tests/kernels/test_elementwise.py).

    python benchmarks/optimizer_passes.py [--params 6400000] [--tensors 220] [--repeats 5]

Run with OMP_NUM_THREADS=1 for the per-rank figure the determinism benchmark sees.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from machine import cpu_name

from credit.parallel.exact_norm import _bins, bins_torch
from credit.train.elementwise_adamw import ElementwiseAdamW


def _ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=6_400_000)
    parser.add_argument("--tensors", type=int, default=220)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    weights = torch.rand(args.tensors, generator=g)
    sizes = [max(1, int(w)) for w in (weights / weights.sum() * args.params).tolist()]
    rows = [[torch.randn(n, generator=g), torch.randn(n, generator=g) * 1e-3, torch.zeros(n), torch.zeros(n)]
            for n in sizes]
    twins = [[t.clone() for t in row] for row in rows]
    flat = torch.cat([row[1] for row in rows])
    opt = ElementwiseAdamW([torch.zeros(1)], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    group = opt.param_groups[0]
    steps = [3.0] * len(rows)
    opt._update(rows, steps, group)  # builds the extension, warms the caches
    opt._update_foreach(twins, steps, group)
    times: dict[str, list[float]] = {k: [] for k in ("adamw fused", "adamw list-wide", "bins fused", "bins torch")}
    for _ in range(args.repeats):
        times["adamw fused"].append(_ms(lambda: opt._update(rows, steps, group)))
        times["adamw list-wide"].append(_ms(lambda: opt._update_foreach(twins, steps, group)))
        times["bins fused"].append(_ms(lambda: _bins([flat])))
        times["bins torch"].append(_ms(lambda: bins_torch(flat)))
    print(f"# {cpu_name()}, torch threads {torch.get_num_threads()}, {sum(sizes):,} float32 parameters in "
          f"{len(sizes)} tensors, {args.repeats} interleaved repeats")
    print("| pass | fused (ms, median / best) | torch ops (ms, median / best) | speed-up (medians) |")
    print("| --- | --- | --- | --- |")
    for name, fused, other in (("AdamW update", "adamw fused", "adamw list-wide"),
                               ("exact-norm square sums", "bins fused", "bins torch")):
        a, b = statistics.median(times[fused]), statistics.median(times[other])
        print(f"| {name} | {a:.1f} / {min(times[fused]):.1f} | {b:.1f} / {min(times[other]):.1f} | {b / a:.2f}x |")


if __name__ == "__main__":
    main()
