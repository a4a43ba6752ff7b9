#!/usr/bin/env python3
"""Train-step time of spectral-normed blocks sharded over tp vs replicated on every tp rank.

One torchrun launch (dp2 x tp2, FSDP2 + TP, the default experiment) builds three trainers
on the same data: spectral norm off, spectral norm with `model.spectral_norm_tp=shard`, and
with `replicate` (each tp rank computing every spectral-normed block whole). Their real
train steps run interleaved (off, shard, replicate, off, ...). Reported: median step times
and their ratios.

    python benchmarks/spectral_norm_tp.py [--steps 20] [--gemm fast|deterministic] [--out FILE] [KEY=VALUE ...]

Trailing KEY=VALUE overrides apply to all three sides (e.g. model.dim=[256,256,512]).
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
SIDES = {
    "spectral norm off": ["model.use_spectral_norm=false"],
    "shard": ["model.use_spectral_norm=true", "model.spectral_norm_tp=shard"],
    "replicate": ["model.use_spectral_norm=true", "model.spectral_norm_tp=replicate"],
}


def compare(gemm: str, steps: int, out: str, extra: list[str]) -> None:
    import torch.distributed as dist

    from credit.config import compose_config
    from credit.parallel import build_runtime
    from credit.train.trainer import Trainer

    scratch = tempfile.mkdtemp()
    runtime, trainers = None, {}
    for name, overrides in SIDES.items():
        cfg = compose_config([*OVERRIDES, f"model.gemm={gemm}", *extra, *overrides,
                              f"run_dir={scratch}/{len(trainers)}"])
        runtime = runtime or build_runtime(cfg)
        trainer = Trainer(cfg, runtime)
        trainer.setup()
        trainer.model.train()
        trainers[name] = (trainer, iter(trainer.loader))
    times = {name: [] for name in SIDES}
    for i in range(steps + 2):  # two warm-up steps each
        for name, (trainer, batches) in trainers.items():
            seconds = trainer.train_step(batches).seconds
            if i >= 2:
                times[name].append(seconds)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps measured per side")
    parser.add_argument("--gemm", choices=["fast", "deterministic"], default="fast")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args, extra = parser.parse_known_args()
    if args.result:
        return compare(args.gemm, args.steps, args.result, extra)
    with tempfile.TemporaryDirectory() as tmp:
        result = f"{tmp}/sn.json"
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node=4", __file__, "--gemm", args.gemm, "--steps",
                        str(args.steps), "--result", result, *extra],
                       check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        times = json.loads(Path(result).read_text())
    median = {name: statistics.median(t) for name, t in times.items()}
    off = median["spectral norm off"]
    lines = [
        f"# Spectral norm under tensor parallelism: step time, shard vs replicate "
        f"(dp2 x tp2, FSDP2 + TP, gemm {args.gemm})",
        "",
        f"Machine: {_cpu_name()}, {os.cpu_count()} cores, OMP_NUM_THREADS=1 per rank, 4 ranks (gloo); "
        f"default experiment, global batch 16; {args.steps} steps per side, interleaved "
        f"(off, shard, replicate, ...) after 2 warm-up steps each; medians of step times."
        + (f" Overrides: `{' '.join(extra)}`." if extra else ""),
        "",
        "| side | seconds | over spectral norm off |",
        "| --- | ---: | ---: |",
        *(f"| {name} | {m:.3f} | {m / off:.2f}x |" for name, m in median.items()),
        "",
        f"**replicate / shard: {median['replicate'] / median['shard']:.2f}x** (step time of the old "
        f"behaviour over sharded spectral norm)",
        "",
        f"Reproduce: `python benchmarks/spectral_norm_tp.py --gemm {args.gemm} --steps {args.steps}"
        f"{''.join(' ' + e for e in extra)}`",
    ]
    report(lines, args.out)


if __name__ == "__main__":
    main()
