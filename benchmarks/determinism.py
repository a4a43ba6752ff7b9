#!/usr/bin/env python3
"""Cost of deterministic mode: its train step over the fast mode's, on the default experiment.

One process (or one torchrun launch) builds two trainers on the same data, one per
`model.gemm`, and times their real train steps interleaved in ABBA order (det, fast, fast, det,
...: the first of a pair reads its batch's files cold), so both see the same machine state.
Reported: the median step time of each and their ratio,
the share of the deterministic step spent inside the GEMM kernels (timed around every
kernel call), and the peak resident memory of a process training only one mode (separate
processes: memory is not noisy, and one process cannot separate two models' peaks).

    python benchmarks/determinism.py [--steps 12] [--layout single|dp2xtp2] [--device cpu|cuda]
                                     [--profile N] [--out FILE] [KEY=VALUE ...]

`--profile N` adds N more steps per mode (interleaved, after the timed ones) under
torch.profiler and a table of where each mode's time goes, by operation family
(`op_families.py`; rank 0's events): self CPU time, and on `--device cuda` a second
table of kernel time (a GPU step can be bound by either side). The profiler's
per-op overhead inflates families of many small ops: read the table's differences, not its
totals, against the unprofiled step times above it.

Trailing KEY=VALUE overrides change the experiment (a smaller grid, another data root). On
`--device cuda` the peak is the GPU's (`torch.cuda.max_memory_allocated`), the machine is
named by its GPU, and the GEMM share is not measured: kernels run asynchronously there, and
timing each call would need a synchronization that slows the step it measures.

Goal (issue): deterministic / fast <= 1.3 at one process and at dp2 x tp2.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_name

LAYOUTS = {"single": (1, ["parallelism=single"]),
           "dp2xtp2": (4, ["parallelism=fsdp2_tp2", "trainer.batch_size=8"])}
COMMON = ["trainer.progress_bar=false", "trainer.valid_every_n_steps=0",
          "trainer.checkpoint.every_n_steps=0", "trainer.resume=never"]


def report(lines: list[str], out: Path | None) -> None:
    """Print a result table; also write it to `out` when given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        out.write_text(text)


def _machine(device: str) -> str:
    if device == "cuda":
        import torch

        return f"{torch.cuda.get_device_name()}, {os.cpu_count()} CPU cores"
    return f"{cpu_name()}, {os.cpu_count()} cores"


def _timed_kernels() -> list[float]:
    """Wrap the GEMM entry points so every kernel call adds its seconds to the list."""
    import credit.kernels.gemm._ops as ops
    from credit.kernels.gemm import _cpu  # the convolutions' gather GEMMs and the column sums

    spent: list[float] = []

    def timed(run):
        def call(*args, **kwargs):
            start = time.perf_counter()
            out = run(*args, **kwargs)
            spent.append(time.perf_counter() - start)
            return out

        return call

    lookup = ops.kernel
    ops.kernel = lambda backend: timed(lookup(backend))
    _cpu.mm_gather, _cpu.colsum = timed(_cpu.mm_gather), timed(_cpu.colsum)
    return spent


def _trainer(overrides: list[str], mode: str, run_dir: str, runtime=None):
    from credit.config import compose_config
    from credit.parallel import build_runtime
    from credit.train.trainer import Trainer

    cfg = compose_config([*overrides, *COMMON, f"model.gemm={mode}", f"run_dir={run_dir}"])
    runtime = runtime or build_runtime(cfg)
    trainer = Trainer(cfg, runtime)
    trainer.setup()
    trainer.model.train()
    return trainer, runtime


def compare(overrides: list[str], steps: int, out: str, device: str, profiled: int = 0) -> None:
    """One rank: both trainers, steps interleaved; rank 0 writes the timings as JSON."""
    import torch.distributed as dist

    spent = _timed_kernels() if device == "cpu" else []
    scratch = tempfile.mkdtemp()
    det, runtime = _trainer(overrides, "deterministic", f"{scratch}/det")
    fast, _ = _trainer(overrides, "fast", f"{scratch}/fast", runtime)
    det_batches, fast_batches = iter(det.loader), iter(fast.loader)
    times = {"deterministic": [], "fast": []}
    gemm = []
    for i in range(steps + 2):  # two warm-up steps each
        # ABBA order: the mode that runs first in a pair reads each batch's files cold
        if i % 2:
            t_fast = fast.train_step(fast_batches).seconds
        spent.clear()
        t_det = det.train_step(det_batches).seconds
        in_kernels = sum(spent)
        if not i % 2:
            t_fast = fast.train_step(fast_batches).seconds
        if i >= 2:
            times["deterministic"].append(t_det)
            times["fast"].append(t_fast)
            if device == "cpu":
                gemm.append(in_kernels / t_det)
    families: dict[str, list] = {"deterministic": [], "fast": []}
    if profiled:
        from op_families import profile_step

        for i in range(profiled):
            order = ("deterministic", "fast") if i % 2 == 0 else ("fast", "deterministic")
            for mode in order:
                trainer, batches = (det, det_batches) if mode == "deterministic" else (fast, fast_batches)
                families[mode].append(profile_step(trainer, batches))
    if not dist.is_initialized() or dist.get_rank() == 0:
        Path(out).write_text(json.dumps(dict(times=times, gemm_share=gemm, families=families)))


def peak_memory(overrides: list[str], mode: str, steps: int, out: str) -> None:
    trainer, _ = _trainer(overrides, mode, tempfile.mkdtemp())
    batches = iter(trainer.loader)
    for _ in range(steps):
        trainer.train_step(batches)
    if trainer.runtime.device.type == "cuda":
        import torch

        peak = torch.cuda.max_memory_allocated(trainer.runtime.device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    Path(f"{out}.{os.environ.get('RANK', '0')}").write_text(str(peak))


def _launch(ranks: int, *args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    prefix = [sys.executable]
    if ranks > 1:
        prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    subprocess.run([*prefix, __file__, *args], check=True, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="single")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--model", help="model=NAME to time (default: the default experiment's)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="N profiled steps per mode: time per operation family")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", choices=["compare", "memory"], help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    args = parser.parse_args()
    ranks, overrides = LAYOUTS[args.layout]
    overrides = [*overrides, f"trainer.device={args.device}", *([f"model={args.model}"] if args.model else []),
                 *args.overrides]
    model_args = ["--model", args.model] if args.model else []
    if args.worker == "compare":
        return compare(overrides, args.steps, args.result, args.device, args.profile)
    if args.worker == "memory":
        return peak_memory(overrides, args.mode, args.steps, args.result)

    with tempfile.TemporaryDirectory() as tmp:
        result = f"{tmp}/compare.json"
        _launch(ranks, "--layout", args.layout, "--device", args.device, "--steps", str(args.steps),
                *model_args, "--profile", str(args.profile), "--worker", "compare", "--result", result,
                *args.overrides)
        data = json.loads(Path(result).read_text())
        peaks = {}
        for mode in ("deterministic", "fast"):
            _launch(ranks, "--layout", args.layout, "--device", args.device, "--steps", "3",
                    *model_args, "--worker", "memory", "--mode", mode, "--result", f"{tmp}/{mode}",
                    *args.overrides)
            peaks[mode] = max(int(p.read_text()) for p in Path(tmp).glob(f"{mode}.*"))
    det, fast = (statistics.median(data["times"][m]) for m in ("deterministic", "fast"))
    ratios = [d / f for d, f in zip(data["times"]["deterministic"], data["times"]["fast"])]
    lines = [
        f"# Deterministic vs fast train step: default experiment{f' with model={args.model}' if args.model else ''}"
        f"{' with the overrides below' if args.overrides else ''}, layout {args.layout}",
        "",
        f"Machine: {_machine(args.device)}, OMP_NUM_THREADS=1 per rank, {ranks} rank(s); "
        f"{args.steps} interleaved steps per mode after 2 warm-up steps.",
        "",
        "| measure | deterministic | fast | ratio |",
        "| --- | --- | --- | --- |",
        f"| median step (s) | {det:.3f} | {fast:.3f} | {det / fast:.2f}x |",
        f"| steps/s | {1 / det:.2f} | {1 / fast:.2f} | |",
        f"| per-pair ratio, min / median / max | | | {min(ratios):.2f} / {statistics.median(ratios):.2f} / "
        f"{max(ratios):.2f} |",
        f"| peak {'GPU memory' if args.device == 'cuda' else 'RSS'} per rank (MiB) | {peaks['deterministic'] / 2**20:.0f} | {peaks['fast'] / 2**20:.0f} | "
        f"{peaks['deterministic'] / peaks['fast']:.2f}x |",
        f"| share of the deterministic step in GEMM kernels | "
        f"{format(statistics.median(data['gemm_share']), '.0%') if data['gemm_share'] else 'not measured on cuda'} | | |",
        "",
        f"Reproduce: `python benchmarks/determinism.py --layout {args.layout} --device {args.device} "
        f"--steps {args.steps}{' --model ' + args.model if args.model else ''}"
        f"{f' --profile {args.profile}' if args.profile else ''}"
        f"{''.join(' ' + o for o in args.overrides)}`",
    ]
    if args.profile:
        from op_families import merge, table

        clocks = {"host": "self CPU time", "device": "GPU kernel time"}
        for clock in [c for c in clocks if c in data["families"]["deterministic"][0]]:
            det_runs, fast_runs = ([run[clock] for run in data["families"][m]] for m in ("deterministic", "fast"))
            lines += ["", f"## Where the time goes: median of {args.profile} profiled steps per mode, rank 0, "
                          f"{clocks[clock]} by operation family", "", *table(merge(det_runs), merge(fast_runs))]
        lines += ["", "Forward work counts for the innermost family range it ran in, backward work for the family "
                      "of the forward op that created its autograd node (benchmarks/op_families.py)."]
    report(lines, args.out)


if __name__ == "__main__":
    main()
