"""What a short `credit train --nproc N` costs in CPU before and around its steps, and what
launching again from the same process saves (the test suite's `tests/launches.py`).

    python benchmarks/launch_cost.py [--nproc 4] [--repeat 2]

On the tiny 16x32 dataset, fast mode, one training step. Measures, interleaved (ABBA):
  fresh:  `python -m credit.cli train --nproc N ...` (a new interpreter, launcher and forkserver)
  reused: `credit.cli.main(["train", "--nproc", N, ...])` from this process, whose forkserver
          stays up between launches (started once before the timed launches)
and once each: a fresh launch whose ranks stop at their first check (run_dir is a file), the
cost before any step. CPU seconds are the whole machine's (user + system, from /proc/stat:
Linux only), so nothing else should run meanwhile. Prints the CPU model and thread setting.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OVERRIDES = ["data.generate_if_missing=false", "data.levels=[500,850]", "data.train_period=[2000-01-01,2000-01-12]",
             "data.valid_period=[2001-01-01,2001-01-12]", "data.valid_samples=8", "trainer.progress_bar=false",
             "trainer.max_steps=1", "trainer.valid_every_n_steps=0", "trainer.checkpoint.every_n_steps=0"]


def _cpu_seconds() -> float:
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _measured(run) -> tuple[float, float]:
    cpu, wall = _cpu_seconds(), time.perf_counter()
    run()
    return _cpu_seconds() - cpu, time.perf_counter() - wall


def _cpu_model() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2, help="ABBA rounds")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    from credit.cli import main as credit_main

    layout = ["parallelism=fsdp2_tp2", "trainer.batch_size=2"] if args.nproc == 4 else ["parallelism=fsdp2"]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        subprocess.run([sys.executable, "-m", "credit.cli", "data", "generate", "--out", str(data), "--grid", "16x32",
                        "--years", "2000", "2001", "--levels", "500", "850", "--train-years", "2000",
                        "--days-per-year", "12", "--no-progress"], check=True, capture_output=True)
        runs = iter(range(10**6))

        def command(run_dir: Path) -> list[str]:
            return ["train", "--nproc", str(args.nproc), *layout, f"data.root={data}", *OVERRIDES, f"run_dir={run_dir}"]

        def fresh(run_dir: Path | None = None) -> None:
            target = run_dir or Path(tmp) / f"run{next(runs)}"
            subprocess.run([sys.executable, "-m", "credit.cli", *command(target)], check=run_dir is None,
                           capture_output=True)

        def reused() -> None:
            try:
                credit_main(command(Path(tmp) / f"run{next(runs)}"))
            except SystemExit as exit_:
                if exit_.code:
                    raise

        reused()  # starts this process's forkserver, as a test process's first launch does
        stopped = Path(tmp) / "a_file"
        stopped.write_text("")
        before_steps = _measured(lambda: fresh(stopped))
        times: dict[str, list[tuple[float, float]]] = {"fresh": [], "reused": []}
        for _ in range(args.repeat):
            for name in ("fresh", "reused", "reused", "fresh"):
                times[name].append(_measured(fresh if name == "fresh" else reused))
    cpu = {name: statistics.median(c for c, _ in t) for name, t in times.items()}
    wall = {name: statistics.median(w for _, w in t) for name, t in times.items()}
    print(f"{_cpu_model()}, {os.cpu_count()} cores, OMP_NUM_THREADS=1 per rank; {args.nproc} ranks, "
          f"one fast step on 16x32; medians of {2 * args.repeat} launches each, interleaved ABBA")
    print("| launch | CPU s | wall s |")
    print("| --- | --- | --- |")
    print(f"| fresh, ranks stopped at their first check | {before_steps[0]:.1f} | {before_steps[1]:.1f} |")
    for name in ("fresh", "reused"):
        print(f"| {name}, one step | {cpu[name]:.1f} | {wall[name]:.1f} |")
    print(f"reused / fresh: CPU {cpu['reused'] / cpu['fresh']:.2f}, wall {wall['reused'] / wall['fresh']:.2f}")


if __name__ == "__main__":
    main()
