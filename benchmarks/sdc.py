#!/usr/bin/env python3
"""Cost of the SDC checks: train-step time with `diagnostics.sdc` on over checks off.

One torchrun launch (dp2 x tp2, FSDP2 + TP, the default experiment) builds two trainers on
the same data: one without the detector, one with every check on and `every_n_steps=2`, so
its steps alternate checked / unchecked. Their real train steps run interleaved (off, on,
off, on, ...). Reported: a checked step over a step without the detector (the cost of
checking every step), an unchecked step with the hooks installed over it, and checks every
10 steps = (9 unchecked + 1 checked) / 10 steps without the detector.

    python benchmarks/sdc.py [--steps 20] [--gemm fast|deterministic] [--out FILE]

Goal (issue): checks every 10 steps <= 1.10x.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from determinism import _cpu_name, report  # noqa: E402  (one home for the machine's name)

OVERRIDES = ["parallelism=fsdp2_tp2", "trainer.batch_size=8", "trainer.progress_bar=false",
             "trainer.valid_every_n_steps=0", "trainer.checkpoint.every_n_steps=0",
             "trainer.resume=never"]
CHECKS = ["diagnostics.sdc.enabled=true", "diagnostics.sdc.every_n_steps=2"]


def _trainer(overrides: list[str], run_dir: str, runtime=None):
    from credit.config import compose_config
    from credit.parallel import build_runtime
    from credit.train.trainer import Trainer

    cfg = compose_config([*OVERRIDES, *overrides, f"run_dir={run_dir}"])
    runtime = runtime or build_runtime(cfg)
    trainer = Trainer(cfg, runtime)
    trainer.setup()
    trainer.model.train()
    return trainer, runtime


def compare(gemm: str, steps: int, out: str, model: list[str]) -> None:
    import torch.distributed as dist

    scratch = tempfile.mkdtemp()
    off, runtime = _trainer([*model, f"model.gemm={gemm}"], f"{scratch}/off")
    on, _ = _trainer([*model, f"model.gemm={gemm}", *CHECKS], f"{scratch}/on", runtime)
    off_batches, on_batches = iter(off.loader), iter(on.loader)
    times = {"off": [], "checked": [], "unchecked": []}
    verified = 0
    for i in range(2 * steps + 2):  # two warm-up steps each
        t_off = off.train_step(off_batches).seconds
        result = on.train_step(on_batches)
        verified += result.sdc.layers_verified
        if i >= 2:
            times["off"].append(t_off)
            times["checked" if result.sdc.checks_run else "unchecked"].append(result.seconds)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(dict(times=times, verified=verified)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="checked steps measured")
    parser.add_argument("--gemm", choices=["fast", "deterministic"], default="fast")
    parser.add_argument("--model", help="model=NAME to time (default: the default experiment's)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = [f"model={args.model}"] if args.model else []
    if args.result:
        return compare(args.gemm, args.steps, args.result, model)
    with tempfile.TemporaryDirectory() as tmp:
        result = f"{tmp}/sdc.json"
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node=4", __file__, "--gemm", args.gemm, "--steps",
                        str(args.steps), "--result", result, *(["--model", args.model] if args.model else [])],
                       check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        data = json.loads(Path(result).read_text())
    off, checked, unchecked = (statistics.median(data["times"][k]) for k in ("off", "checked", "unchecked"))
    every10 = (9 * unchecked + checked) / (10 * off)
    lines = [
        f"# SDC checks: train step with checks over checks off (dp2 x tp2, FSDP2 + TP, gemm {args.gemm})",
        "",
        f"Machine: {_cpu_name()}, {os.cpu_count()} cores, OMP_NUM_THREADS=1 per rank, 4 ranks (gloo); "
        f"default experiment, global batch 16; {2 * args.steps} steps with checks (every 2nd checked: "
        f"comm, replica, compute) interleaved with {2 * args.steps} steps without the detector, after "
        f"2 warm-up steps each; {data['verified']} layers verified, medians of step times.",
        "",
        "| measure | seconds | over checks off |",
        "| --- | ---: | ---: |",
        f"| step, checks off (no detector) | {off:.3f} | 1.00x |",
        f"| step with hooks installed, not checked | {unchecked:.3f} | {unchecked / off:.2f}x |",
        f"| checked step (= checks every step) | {checked:.3f} | {checked / off:.2f}x |",
        f"| **checks every 10 steps** (9 unchecked + 1 checked) | | **{every10:.2f}x** (goal <= 1.10x) |",
        "",
        f"Reproduce: `python benchmarks/sdc.py --gemm {args.gemm} --steps {args.steps}"
        f"{' --model ' + args.model if args.model else ''}`",
    ]
    report(lines, args.out)


if __name__ == "__main__":
    main()
