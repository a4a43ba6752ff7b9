#!/usr/bin/env python3
"""Compare the per-step training losses of two runs: python check_parity.py RUN_A RUN_B.

Passes (exit 0) only if both runs finished (their last checkpoint step equals
trainer.max_steps), logged the same number of steps, and every raw step loss matches:
exactly with --exact, else within --rtol (default 1e-5). Otherwise prints the first
differing step and exits 1. Reads `metrics.csv` and `config.yaml` in each run directory.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import yaml


def _losses(run: Path) -> list[tuple[int, str]]:
    metrics = run / "metrics.csv"
    if not metrics.is_file():
        raise SystemExit(f"FAIL: {metrics} does not exist (did the run start?)")
    with metrics.open(newline="") as f:
        return [(int(r["step"]), r["loss"]) for r in csv.DictReader(f) if r["split"] == "train"]


def _finished(run: Path) -> tuple[bool, str]:
    config = run / "config.yaml"
    if not config.is_file():
        return False, f"{config} does not exist"
    max_steps = yaml.safe_load(config.read_text()).get("trainer", {}).get("max_steps")
    checkpoints = sorted((run / "checkpoints").glob("step_*/.metadata"))
    last = int(checkpoints[-1].parent.name.split("_")[1]) if checkpoints else 0
    if max_steps is None or last != max_steps:
        return False, f"last complete checkpoint is step {last}, trainer.max_steps is {max_steps}"
    return True, ""


def compare(run_a: Path, run_b: Path, rtol: float, exact: bool) -> int:
    for run in (run_a, run_b):
        done, why = _finished(run)
        if not done:
            print(f"FAIL: {run} did not finish: {why}")
            return 1
    a, b = _losses(run_a), _losses(run_b)
    if len(a) != len(b):
        print(f"FAIL: {run_a} logged {len(a)} steps, {run_b} logged {len(b)}")
        return 1
    if [s for s, _ in a] != [s for s, _ in b]:
        print("FAIL: the runs logged different step numbers")
        return 1
    worst = 0.0
    for (step, la), (_, lb) in zip(a, b):
        fa, fb = float(la), float(lb)
        same = la == lb if exact else (math.isfinite(fa) and math.isclose(fa, fb, rel_tol=rtol, abs_tol=0.0))
        if not same:
            print(f"FAIL: first difference at step {step}: {la} vs {lb} "
                  f"(relative {abs(fa - fb) / max(abs(fa), abs(fb), 1e-300):.3e})")
            return 1
        worst = max(worst, abs(fa - fb) / max(abs(fa), 1e-300))
    mode = "exactly" if exact else f"within rtol {rtol:g}"
    print(f"PASS: {len(a)} steps match {mode} (largest relative difference {worst:.3e})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--rtol", type=float, default=1e-5)
    parser.add_argument("--exact", action="store_true", help="require bitwise-equal losses")
    args = parser.parse_args(argv)
    return compare(args.run_a, args.run_b, args.rtol, args.exact)


if __name__ == "__main__":
    sys.exit(main())
