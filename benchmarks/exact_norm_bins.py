#!/usr/bin/env python3
"""The exact gradient norm's integer square sums over a model's gradients, on any device.

`credit.parallel.exact_norm` bins every gradient element by its float32 exponent and sums
integer squares of its significand's halves. Times, on the parameter shapes of CREDIT's three
classes (built from the default experiment with the overrides given), interleaved:

- `current`: `exact_norm._bins` over the list (a fused pass per tensor on the CPU; elsewhere
  torch's ops and one integer `index_add_` over the concatenation);
- `per-tensor bincount`: the implementation before 2026-11-27, torch's ops and three float64
  `bincount`s per gradient (on CUDA each bincount reads its size back to the host);
- `concatenated bincount`: the same ops over the concatenation (the implementation before that).

All three give the same bins (checked here). On CUDA the current path also runs under
`torch.use_deterministic_algorithms(True)`, which refuses a CUDA bincount with weights.

    python benchmarks/exact_norm_bins.py [--device cpu|cuda] [--repeats 10] [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
from machine import cpu_name

from credit.parallel import exact_norm

MODELS = ("nextgen_wxformer", "wxformer", "crossformer")


def _bincount_bins(flat: torch.Tensor) -> torch.Tensor:
    """The earlier implementation: float64 bincounts (exact: integer sums below 2**53)."""
    i32 = exact_norm._int32
    total = torch.zeros(3, 256, dtype=torch.int64, device=flat.device)
    for part in flat.split(exact_norm._CHUNK):
        bits = part.contiguous().view(torch.int32)
        field = torch.bitwise_and(torch.bitwise_right_shift(bits, i32(23)), i32(0xFF))
        significand = torch.bitwise_and(bits, i32(0x7FFFFF))
        significand = torch.where(field > 0, torch.bitwise_or(significand, i32(0x800000)), significand)
        hi, lo = torch.bitwise_right_shift(significand, i32(12)), torch.bitwise_and(significand, i32(0xFFF))
        index = field.to(torch.int64)
        for row, product in enumerate((hi * hi, hi * lo, lo * lo)):
            total[row] += torch.bincount(index, weights=product.to(torch.float64), minlength=256).to(torch.int64)
    return total


def _per_tensor(tensors: list[torch.Tensor]) -> torch.Tensor:
    total = _bincount_bins(tensors[0].reshape(-1))
    for t in tensors[1:]:
        total += _bincount_bins(t.reshape(-1))
    return total.cpu()


def _concatenated(tensors: list[torch.Tensor]) -> torch.Tensor:
    return _bincount_bins(torch.cat([t.reshape(-1) for t in tensors])).cpu()


def _current(tensors: list[torch.Tensor]) -> torch.Tensor:
    return exact_norm._bins(tensors).cpu()


def _shapes(model: str, overrides: list[str]) -> list[torch.Size]:
    sys.path.insert(0, os.path.dirname(__file__))
    from determinism import _trainer

    extra = [] if model == "nextgen_wxformer" else [f"model={model}"]
    with tempfile.TemporaryDirectory() as run_dir:
        trainer, _ = _trainer([*extra, *overrides, "trainer.device=cpu"], "deterministic", run_dir)
        return [p.shape for p in trainer.model.parameters()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE for the experiment (e.g. data.root=DIR)")
    args = parser.parse_args()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    machine = (f"{torch.cuda.get_device_name()}, {os.cpu_count()} CPU cores" if device.type == "cuda"
               else f"{cpu_name()}, torch threads {torch.get_num_threads()}")
    print(f"# exact-norm square sums per step, {machine}, torch {torch.__version__}, median of "
          f"{args.repeats} interleaved repeats\n")
    print("| model | gradients | current (ms) | per-tensor bincount (ms) | concatenated bincount (ms) |")
    print("| --- | --- | --- | --- | --- |")
    g = torch.Generator().manual_seed(0)
    ways = {"current": _current, "per-tensor": _per_tensor, "concatenated": _concatenated}
    for model in MODELS:
        grads = [(torch.randn(shape, generator=g) * 1e-3).to(device) for shape in _shapes(model, args.overrides)]
        expected = _current(grads)
        if not all(torch.equal(fn(grads), expected) for fn in ways.values()):
            raise SystemExit(f"{model}: the three ways disagree")
        if device.type == "cuda":
            torch.use_deterministic_algorithms(True)
            _current(grads)  # index_add_ is allowed under the switch
            torch.use_deterministic_algorithms(False)
        times: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(args.repeats):
            for name, fn in ways.items():
                sync()
                start = time.perf_counter()
                fn(grads)
                sync()
                times[name].append((time.perf_counter() - start) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"| {model} | {len(grads)} | {med['current']:.2f} | {med['per-tensor']:.2f} | {med['concatenated']:.2f} |")
    print(f"\nReproduce: `python benchmarks/exact_norm_bins.py --device {args.device} --repeats {args.repeats}"
          f"{''.join(' ' + o for o in args.overrides)}`")


if __name__ == "__main__":
    main()
