"""Benchmark the deterministic GEMM against torch.matmul.

Prints, per backend, dtype, thread count and shape, the median time of the
deterministic kernel and of ``torch.matmul`` and the speed ratio
``t(torch.matmul) / t(det)`` (1.0 = parity, higher is faster), for the forward
pass and for forward + backward (dA and dB). Samples alternate (det, torch, det,
torch, ...) so both sides see the same machine state; the ratio is the median of the
per-pair ratios, printed beside the CPU model / GPU name and the thread count.

Shapes (M, K, N), by `--shapes` (comma-separated sets; default square,projections, plus
gpu-square on a GPU):
- square: 1024^3 and 4096x1024x1024; gpu-square: 4096^3;
- projections: M = 8192 tokens and (K, N) in {(64,64), (64,256), (256,64), (128,128),
  (128,512), (512,128)};
- experiment: every projection of the composed experiment's model (`--override KEY=VALUE`
  adjusts the config) at its batch size, traced on the meta device;
- credit:FILE: every projection of the model a CREDIT `model:` section describes, batch 1
  (benchmarks/configs/wxformer_0.25deg.yml is CREDIT's 0.25-degree wxformer).

    PYTHONPATH=. python benchmarks/gemm.py            # full run
    PYTHONPATH=. python benchmarks/gemm.py --quick    # 1 thread, fewer shapes
    PYTHONPATH=. python benchmarks/gemm.py --quick --out benchmarks/results/gemm_cpu.md
    PYTHONPATH=. python benchmarks/gemm.py --backends triton,cuda --dtypes bfloat16,float32 \
        --shapes gpu-square,experiment,credit:benchmarks/configs/wxformer_0.25deg.yml

Backends that cannot run here are listed as "not available on this machine"
with the reason, and are never timed.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

from credit.kernels.gemm import available_backends, det_mm
from credit.kernels.gemm._registry import unavailable_reason
from machine import cpu_name

SQUARE = [(1024, 1024, 1024), (4096, 1024, 1024)]
GPU_SQUARE = [(4096, 4096, 4096)]  # the GPU goal: >= 0.6x cuBLAS bf16 here
PROJECTIONS = [(8192, k, n) for k, n in
               [(64, 64), (64, 256), (256, 64), (128, 128), (128, 512), (512, 128)]]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _calls_per_sample(fn: Callable[[], object], device: torch.device, min_time: float) -> int:
    fn()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return max(1, int(min_time / max(time.perf_counter() - t0, 1e-6)))


def interleaved(det: Callable[[], object], ref: Callable[[], object], device: torch.device,
                repeat: int, min_time: float = 0.05) -> tuple[float, float, float]:
    """(median det s, median ref s, median per-pair ratio ref/det) from samples taken
    det, ref, det, ref, ...; each sample runs enough calls to last min_time."""
    n_det, n_ref = _calls_per_sample(det, device, min_time), _calls_per_sample(ref, device, min_time)
    det_s, ref_s = [], []
    for _ in range(repeat):
        for fn, n, out in ((det, n_det, det_s), (ref, n_ref, ref_s)):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            sync(device)
            out.append((time.perf_counter() - t0) / n)
    ratios = [r / d for d, r in zip(det_s, ref_s)]
    return statistics.median(det_s), statistics.median(ref_s), statistics.median(ratios)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def experiment_shapes(overrides: list[str]) -> list[tuple[int, int, int]]:
    """The projection products of the composed experiment's model at its batch size (its
    data must exist: the layout is read from one sample)."""
    from credit.config import compose_config
    from credit.data import build_dataset, model_layout
    from credit.models import build_model
    from credit.models.gemm_shapes import projection_gemms
    from credit.models.inputs import predict

    cfg = compose_config(overrides)
    dataset = build_dataset(cfg.data, "train_period")
    sample, batch = dataset[0], cfg.trainer.batch_size
    layout = model_layout(cfg.data, dataset)
    with torch.device("meta"):
        model = build_model(cfg.model, **layout)
    state, forcing, static = (torch.empty(batch, *sample[k].shape, device="meta")
                              for k in ("state", "forcing", "static"))
    history = cfg.data.history_len
    counts = projection_gemms(model, lambda m: predict(m, state, forcing[:, : history + 1], static))
    return sorted(counts)


def shape_set(name: str, overrides: list[str]) -> list[tuple[int, int, int]]:
    """The (M, K, N) shapes of one `--shapes` entry."""
    if name == "square":
        return SQUARE
    if name == "gpu-square":
        return GPU_SQUARE
    if name == "projections":
        return PROJECTIONS
    if name == "experiment":
        return experiment_shapes(overrides)
    if name.startswith("credit:"):
        from credit.models.gemm_shapes import credit_section_gemms

        path = Path(name[len("credit:"):])
        try:
            config = yaml.safe_load(path.read_text()) if path.is_file() else None
        except yaml.YAMLError:
            config = None
        if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
            raise SystemExit(f"error: --shapes {name}: {path} is not a file holding a CREDIT `model:` section")
        return sorted(credit_section_gemms(config["model"]))
    raise SystemExit(f"error: --shapes entry {name!r} is not one of square, gpu-square, projections, "
                     f"experiment, credit:FILE")


def bench_shape(backend: str, dtype: torch.dtype, shape: tuple[int, int, int],
                device: torch.device, repeat: int,
                min_time: float = 0.05, whole_k: bool = False) -> dict[str, tuple[float, float, float]]:
    m, k, n = shape
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(dtype=dtype, device=device)
    b = torch.randn(k, n, generator=g).to(dtype=dtype, device=device)
    dc = torch.randn(m, n, generator=g).to(dtype=dtype, device=device)
    ag, bg = a.clone().requires_grad_(), b.clone().requires_grad_()

    def det_fwd():
        return det_mm(a, b, backend=backend, whole_k=whole_k)

    def ref_fwd():
        return torch.matmul(a, b)

    def det_fwd_bwd():
        ag.grad = bg.grad = None
        det_mm(ag, bg, backend=backend, whole_k=whole_k).backward(dc)

    def ref_fwd_bwd():
        ag.grad = bg.grad = None
        torch.matmul(ag, bg).backward(dc)

    return {"fwd": interleaved(det_fwd, ref_fwd, device, repeat, min_time),
            "fb": interleaved(det_fwd_bwd, ref_fwd_bwd, device, repeat, min_time)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="1 thread, 1024^3 and three projection shapes, fewer repeats")
    p.add_argument("--threads", default="1,2", help="comma-separated CPU thread counts")
    p.add_argument("--dtypes", default="float32,bfloat16",
                   help="comma-separated; float16 also works, but torch.matmul has no fast "
                   "CPU float16 kernel, so timing it takes long")
    p.add_argument("--backends", default="cpu,triton,cuda")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--shapes", help="comma-separated shape sets: square, gpu-square, projections, "
                   "experiment, credit:FILE (default: square,projections; gpu-square too on a GPU)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for --shapes experiment (repeatable)")
    p.add_argument("--min-time", type=float, default=0.05,
                   help="seconds each timed sample lasts at least (calls repeated to fill it)")
    p.add_argument("--out", type=Path, help="also write the tables to this file")
    p.add_argument("--whole-k", action="store_true",
                   help="det_mm(..., whole_k=True): the forward as one chain over K where the backend "
                   "has one (triton), the gradients with the tree")
    args = p.parse_args(argv)

    threads = [int(t) for t in args.threads.split(",")]
    repeat = args.repeat
    if args.shapes:
        shapes = list(dict.fromkeys(s for name in args.shapes.split(",")
                                    for s in shape_set(name, args.override)))
        gpu_shapes = shapes
    else:
        shapes = SQUARE + PROJECTIONS
        gpu_shapes = [*GPU_SQUARE, *shapes]
    if args.quick:
        shapes, threads, repeat = [SQUARE[0], *PROJECTIONS[::2]], [1], 3
    dtypes = [DTYPES[d] for d in args.dtypes.split(",")]

    lines = [f"# det_mm vs torch.matmul (torch {torch.__version__}, {platform.machine()}, "
             f"cuda available: {torch.cuda.is_available()})",
             "speed = t(torch.matmul) / t(det), the median of per-pair ratios of samples taken det, "
             "torch, det, torch, ...: 1.0 = parity, higher = det faster"
             + ("; det forward as one chain over K (`--whole-k`)" if args.whole_k else "")]

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    for line in lines:
        print(line)
    for backend in args.backends.split(","):
        device = torch.device("cpu" if backend == "cpu" else "cuda")
        if device.type == "cuda" and not torch.cuda.is_available():
            say(f"\n## backend {backend}: not available on this machine (no CUDA GPU)")
            continue
        why = unavailable_reason(backend, device)
        if why is not None:  # checked before any timing
            say(f"\n## backend {backend}: not available on this machine ({why}); "
                f"available on {device}: {available_backends(device)}")
            continue
        for nt in threads if device.type == "cpu" else [torch.get_num_threads()]:
            torch.set_num_threads(nt)
            where = (f"{device_name(device)}, {os.cpu_count()} cores, {nt} thread(s)"
                     if device.type == "cpu" else device_name(device))
            say(f"\n## backend {backend} on {where}")
            say("| dtype | M x K x N | det fwd ms | torch fwd ms | fwd speed "
                "| det fwd+bwd ms | torch fwd+bwd ms | fwd+bwd speed | machine |")
            say("|---|---|---|---|---|---|---|---|---|")
            for dtype in dtypes:
                for shape in (shapes if device.type == "cpu" else gpu_shapes):
                    r = bench_shape(backend, dtype, shape, device, repeat, args.min_time, args.whole_k)
                    (df, rf, sf), (db, rb, sb) = r["fwd"], r["fb"]
                    say(f"| {str(dtype).replace('torch.', '')} | {'x'.join(map(str, shape))} "
                        f"| {df * 1e3:.2f} | {rf * 1e3:.2f} | {sf:.2f} "
                        f"| {db * 1e3:.2f} | {rb * 1e3:.2f} | {sb:.2f} | {where} |")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
