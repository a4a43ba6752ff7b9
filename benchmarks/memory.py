#!/usr/bin/env python3
"""Per-rank memory of real training steps at several tensor-parallel degrees, with and
without sequence parallelism.

For each variant (tp = 1, 2, 4 on as many gloo ranks, and tp = 2, 4 with
`trainer.parallelism.sequence_parallel=true`: 2sp and 4sp with `sequence_parallel_regather=false`,
4spr with it true, the default; dp = 1, batch 1 by default) a fresh
launch trains on a generated dataset of the chosen grid and reports, max over its ranks:
- activation memory: the peak resident set during a step minus the resident set just before
  it (the parameters, gradients, optimizer state and loader buffers are held before the step);
- peak resident set during a step;
- bytes of parameters, gradients and optimizer state this rank holds (local shards);
- the median step time;
- `credit plan`'s estimate of the activation memory (`credit.plan.trace`: the same step traced
  under fake tensors, its step memory less the gradients, which the resident set before a step
  still holds), beside the measured one.
Variants are launched in rounds (1, 2, 4, 2sp, 4sp, 1, 2, ...) so every variant sees the
same machine state; each figure is the median over the rounds.

Measuring a step's memory through the resident set needs freed memory to leave it: the
workers run with glibc's mmap threshold fixed at 128 KiB (`MALLOC_MMAP_THRESHOLD_`), so every
tensor larger than that is its own mapping, returned to the kernel when freed, instead of
heap pages the allocator keeps.

    python benchmarks/memory.py [--grid 181x360] [--tp 1,2,4,2sp,4sp,4spr] [--rounds 3] [--steps 2]
                                [--out FILE] [KEY=VALUE ...]

The default model is CREDIT's wxformer with widths 32-256, earth-padded from 181x360 to
192x384 (the default experiment's nextgen_wxformer does not tile 181 rows); KEY=VALUE overrides
change it.
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

from machine import cpu_name

# crossformer sized like the default experiment, padded so its windows tile 181x360
MODEL = ["model=wxformer", "model.padding_conf.activate=true", "model.padding_conf.mode=earth",
         "model.padding_conf.pad_lat=[5,6]", "model.padding_conf.pad_lon=[12,12]"]
COMMON = ["trainer.batch_size=1", "trainer.progress_bar=false", "trainer.valid_every_n_steps=0",
          "trainer.checkpoint.every_n_steps=0", "trainer.resume=never", "data.valid_samples=1",
          "data.levels=[500,850]", "data.train_period=[2000-01-01,2000-01-03]",
          "data.valid_period=[2001-01-01,2001-01-03]", "data.generate_if_missing=false"]


def _resident() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def worker(variant: str, steps: int, overrides: list[str], result: str) -> None:
    import torch
    import torch.distributed as dist

    from credit.config import compose_config
    from credit.parallel import build_runtime
    from credit.plan.trace import shard_bytes
    from credit.train.memory import PeakMemory
    from credit.train.trainer import Trainer

    cfg = compose_config([*MODEL, *COMMON, *overrides, *_config_overrides(variant), f"run_dir={tempfile.mkdtemp()}"])
    trainer = Trainer(cfg, build_runtime(cfg))
    trainer.setup()
    trainer.model.train()
    batches = iter(trainer.loader)
    trainer.train_step(batches)  # warm-up: the optimizer state exists from here on
    peaks = PeakMemory(torch.device("cpu"))
    activation, peak_rss, seconds = [], [], []
    for _ in range(steps):
        before = _resident()
        peaks.read()  # resets the peak
        seconds.append(trainer.train_step(batches).seconds)
        peak = peaks.read()[0]
        activation.append(peak - before)
        peak_rss.append(peak)
    held = shard_bytes(trainer.model, trainer.optimizer)
    mine = torch.tensor([statistics.median(activation), statistics.median(peak_rss), held["params"],
                         held["grads"], held["optimizer"]],
                        dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    if not dist.is_initialized() or dist.get_rank() == 0:
        keys = ("activation", "peak_rss", "params", "grads", "optimizer")
        Path(result).write_text(json.dumps({**dict(zip(keys, mine.tolist())),
                                            "step_s": statistics.median(seconds)}))
    if dist.is_initialized():  # every rank done before the group goes: no teardown races at exit
        dist.barrier()
        dist.destroy_process_group()


def _parse(variant: str) -> tuple[int, bool, bool]:
    """'4sp' -> (4, True, False), '4spr' -> (4, True, True): the tensor-parallel degree,
    whether rows are split too, and whether blocks re-gather their inputs in backward."""
    regather = variant.endswith("spr")
    sequence = regather or variant.endswith("sp")
    digits = variant[:-3] if regather else variant[:-2] if sequence else variant
    if not digits.isdigit() or (sequence and int(digits) < 2):
        raise SystemExit(f"--tp {variant}: a degree, optionally followed by sp or spr (degree >= 2)")
    return int(digits), sequence, regather


def _config_overrides(variant: str) -> list[str]:
    tp, sequence, regather = _parse(variant)
    return [f"trainer.parallelism.tensor={tp}", f"trainer.parallelism.sequence_parallel={str(sequence).lower()}",
            f"trainer.parallelism.sequence_parallel_regather={str(regather).lower()}", "trainer.parallelism.data=none"]


def estimate(variant: str, grid: tuple[int, int], overrides: list[str]) -> float:
    """`credit plan`'s activation bytes for a variant, defined as measured here."""
    from credit.config import compose_config
    from credit.plan.shapes import sample_shapes
    from credit.plan.trace import trace_step

    cfg = compose_config([*MODEL, *COMMON, *overrides, *_config_overrides(variant)])
    trace = trace_step(cfg, sample_shapes(cfg, grid), _parse(variant)[0])
    return float(trace.activation - trace.grads)


def _launch(variant: str, steps: int, overrides: list[str], result: str) -> None:
    tp = _parse(variant)[0]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
    prefix = [sys.executable]
    if tp > 1:
        prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={tp}"]
    subprocess.run([*prefix, __file__, "--worker", "--tp", variant, "--steps", str(steps),
                    "--result", result, *overrides], check=True, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", default="181x360", help="NLATxNLON of the generated dataset")
    parser.add_argument("--tp", default="1,2,4,2sp,4sp,4spr",
                        help="comma-separated variants: a tensor-parallel degree, 'sp' appended for sequence "
                             "parallelism, 'spr' for it with regathered block inputs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="measured steps per launch, after one warm-up")
    parser.add_argument("--data-root", type=Path, help="an existing dataset (default: generate one)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args()
    if args.worker:
        return worker(args.tp, args.steps, args.overrides, args.result)

    degrees = args.tp.split(",")
    for variant in degrees:
        _parse(variant)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data_root
        if root is None:
            root = Path(tmp) / "data"
            subprocess.run([sys.executable, "-m", "credit.cli", "data", "generate", "--out", str(root),
                            "--grid", args.grid, "--years", "2000", "2001", "--levels", "500", "850",
                            "--train-years", "2000", "--days-per-year", "3", "--no-progress"], check=True)
        overrides = [f"data.root={root}", *args.overrides]
        runs: dict[str, list[dict]] = {tp: [] for tp in degrees}
        for r in range(args.rounds):
            for tp in degrees:
                result = f"{tmp}/tp{tp}_{r}.json"
                _launch(tp, args.steps, overrides, result)
                runs[tp].append(json.loads(Path(result).read_text()))

    grid = tuple(int(n) for n in args.grid.split("x"))
    planned = {tp: estimate(tp, grid, [o for o in overrides if not o.startswith("data.root=")]) for tp in degrees}

    def med(tp: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[tp])

    base = degrees[0]
    mib = 2**20
    lines = [f"# Per-rank memory of a training step by tensor-parallel degree ({args.grid}, batch 1)", "",
             "Variants: the tensor-parallel degree; `sp` = with sequence parallelism and "
             "`sequence_parallel_regather=false`; `spr` = with it and `sequence_parallel_regather=true` "
             "(the default). plan: `credit plan`'s traced estimate of the same step's activation memory "
             "(its step memory less the gradients, which the resident set before the step still holds).", "",
             f"Machine: {cpu_name()}, {os.cpu_count()} cores, OMP_NUM_THREADS=1 per rank, gloo; "
             f"{args.rounds} rounds of tp {', '.join(map(str, degrees))} (launches interleaved), "
             f"{args.steps} measured steps each after one warm-up; medians over the rounds, max over ranks.", "",
             f"| tp | activation MiB | / tp{base} | plan MiB | plan / measured | peak RSS MiB | params MiB "
             f"| grads MiB | optimizer MiB | step s | / tp{base} |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for tp in degrees:
        lines.append(f"| {tp} | {med(tp, 'activation') / mib:.0f} | {med(tp, 'activation') / med(base, 'activation'):.2f} "
                     f"| {planned[tp] / mib:.0f} | {planned[tp] / med(tp, 'activation'):.2f} "
                     f"| {med(tp, 'peak_rss') / mib:.0f} | {med(tp, 'params') / mib:.1f} | {med(tp, 'grads') / mib:.1f} "
                     f"| {med(tp, 'optimizer') / mib:.1f} | {med(tp, 'step_s'):.2f} "
                     f"| {med(tp, 'step_s') / med(base, 'step_s'):.2f} |")
    lines += ["", "Reproduce: `python benchmarks/memory.py --grid " + args.grid + " --tp " + args.tp
              + f" --rounds {args.rounds} --steps {args.steps}" + "".join(" " + o for o in args.overrides) + "`"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
