#!/usr/bin/env python3
"""Per-rank training-state memory and throughput of the default wxformer under each layout.

For every layout it trains the default model for a few steps with torchrun (gloo on CPU,
nccl on GPU) and reports, on the most loaded rank, the bytes of parameters + gradients +
optimizer state it holds, as a ratio to one process holding everything, plus samples/s
(median over the timed steps). All ratios come from this one invocation.

    python benchmarks/parallel_layouts.py [--steps 12] [--out benchmarks/results/parallel_layouts.md]
        [--layouts "dp2 x tp2 (fsdp2),tp4 (no dp)"] [KEY=VALUE ...]

Trailing KEY=VALUE overrides apply to every layout (e.g. model.use_spectral_norm=true).

Goal: <= 0.30 of the single-process bytes per rank at dp2 x tp2.
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

LAYOUTS = {  # name: (ranks, overrides)
    "single": (1, ["parallelism=single"]),
    "dp2 x tp2 (fsdp2)": (4, ["parallelism=fsdp2_tp2"]),
    "dp4 (fsdp2)": (4, ["parallelism=fsdp2"]),
    "tp4 (no dp)": (4, ["parallelism=single", "trainer.parallelism.tensor=4"]),
    "dp4 (ddp)": (4, ["parallelism=ddp"]),
}


def _local_bytes(tensor) -> int:
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def worker(overrides: list[str], out: str) -> None:
    """One rank: train, then report this rank's bytes of params, grads, optimizer state."""
    import torch
    import torch.distributed as dist

    from credit.config import compose_config
    from credit.parallel import build_runtime
    from credit.train.trainer import Trainer

    cfg = compose_config(overrides)
    trainer = Trainer(cfg, build_runtime(cfg))
    trainer.setup()
    trainer.fit()
    params = sum(_local_bytes(p) for p in trainer.model.parameters())
    grads = sum(_local_bytes(p.grad) for p in trainer.model.parameters() if p.grad is not None)
    optim = sum(
        _local_bytes(v)
        for state in trainer.optimizer.state.values()
        for v in state.values()
        if torch.is_tensor(v) and v.dim() > 0
    )
    mine = torch.tensor([params, grads, optim], dtype=torch.float64)
    if dist.is_initialized():
        everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, mine)
        rank = dist.get_rank()
    else:
        everyone, rank = [mine], 0
    if rank == 0:
        worst = max(everyone, key=lambda t: float(t.sum()))
        Path(out).write_text(json.dumps({"params": worst[0].item(), "grads": worst[1].item(),
                                         "optim": worst[2].item()}))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def run_layout(name: str, ranks: int, overrides: list[str], steps: int, work: Path) -> dict:
    run_dir = work / name.replace(" ", "_").replace("(", "").replace(")", "")
    out = work / f"{run_dir.name}.json"
    args = [*overrides, f"run_dir={run_dir}", f"trainer.max_steps={steps}",
            "trainer.progress_bar=false", "trainer.batch_size=4", "trainer.valid_every_n_steps=0",
            "data.valid_samples=4", "trainer.checkpoint.every_n_steps=0", "trainer.resume=never"]
    me = str(Path(__file__).resolve())
    if ranks == 1:
        command = [sys.executable, me, "--worker", str(out), *args]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={ranks}", me, "--worker", str(out), *args]
    env = {"OMP_NUM_THREADS": "1", **os.environ}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    memory = json.loads(out.read_text())
    import csv

    with (run_dir / "metrics.csv").open() as f:
        rates = [float(r["samples_per_s"]) for r in csv.DictReader(f) if r["split"] == "train"]
    timed = rates[2:] or rates  # the first steps include one-off setup
    return {**memory, "samples_per_s": statistics.median(timed)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    parser.add_argument("--layouts", default=",".join(LAYOUTS),
                        help="comma-separated layouts to run (single always runs: the ratios' base)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    chosen = args.layouts.split(",")
    unknown = [name for name in chosen if name not in LAYOUTS]
    if unknown and not args.worker:
        parser.error(f"--layouts: unknown {unknown}; allowed: {list(LAYOUTS)}")
    if args.worker:
        worker(overrides, args.worker)
        return 0
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (ranks, layout) in LAYOUTS.items():
            if name != "single" and name not in chosen:
                continue
            print(f"running {name} on {ranks} rank(s) ...", flush=True)
            results[name] = run_layout(name, ranks, [*layout, *overrides], args.steps, Path(tmp))
    base = results["single"]
    total = lambda r: r["params"] + r["grads"] + r["optim"]  # noqa: E731
    lines = [
        "| layout | params MiB | grads MiB | optimizer MiB | total / single | samples/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in results.items():
        mib = [r[k] / 2**20 for k in ("params", "grads", "optim")]
        lines.append(f"| {name} | {mib[0]:.2f} | {mib[1]:.2f} | {mib[2]:.2f} | "
                     f"{total(r) / total(base):.3f} | {r['samples_per_s']:.1f} |")
    table = "\n".join(lines)
    print(table)
    if overrides:
        print(f"overrides: {' '.join(overrides)}")
    if "dp2 x tp2 (fsdp2)" in results:
        ratio = total(results["dp2 x tp2 (fsdp2)"]) / total(base)
        verdict = "meets" if ratio <= 0.30 else "misses"
        print(f"dp2 x tp2 per-rank state is {ratio:.3f} of single process ({verdict} the <= 0.30 goal)")
    if args.out:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
