#!/usr/bin/env python3
"""One markdown row per `credit train` run: steps, steps/s, peak GPU memory, last losses.

    python manual_tests/gpu/train_summary.py LABEL=RUN_DIR [LABEL=RUN_DIR ...]

Steps/s is the median over the run's training rows after the first (which holds the warm-up
and the compilation), from `samples_per_s` and the run's `trainer.batch_size`; peak memory is
the largest row of `peak_mem_mib` (allocated; peak RSS on CPU) and `peak_reserved_mib`.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

from omegaconf import OmegaConf


def row(label: str, run: Path) -> str:
    if not (run / "metrics.csv").is_file() or not (run / "config.yaml").is_file():
        return f"| {label} | no finished run in {run} | | | | | | | | | |"
    cfg = OmegaConf.load(run / "config.yaml")
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    train = [r for r in rows if r["split"] == "train"]
    valid = [r for r in rows if r["split"] == "valid"]
    if not train:
        raise SystemExit(f"error: {run / 'metrics.csv'} holds no training row")
    timed = train[1:] or train
    steps_per_s = statistics.median(float(r["samples_per_s"]) for r in timed) / cfg.trainer.batch_size
    allocated = max(float(r.get("peak_mem_mib") or "nan") for r in train)
    reserved = [float(r["peak_reserved_mib"]) for r in train if r.get("peak_reserved_mib")]
    last_valid = float(valid[-1]["loss"]) if valid else float("nan")
    return (f"| {label} | {cfg.model.name} | {cfg.model.gemm} | {cfg.trainer.device} | {train[-1]['step']} "
            f"| {cfg.trainer.batch_size} | {steps_per_s:.2f} | {allocated:.0f} "
            f"| {max(reserved):.0f} | {float(train[-1]['loss']):.5f} | {last_valid:.5f} |"
            if reserved else
            f"| {label} | {cfg.model.name} | {cfg.model.gemm} | {cfg.trainer.device} | {train[-1]['step']} "
            f"| {cfg.trainer.batch_size} | {steps_per_s:.2f} | {allocated:.0f} | - "
            f"| {float(train[-1]['loss']):.5f} | {last_valid:.5f} |")


def main(argv: list[str]) -> int:
    if not argv or any("=" not in a for a in argv):
        raise SystemExit("usage: train_summary.py LABEL=RUN_DIR [LABEL=RUN_DIR ...]")
    print("| run | model | gemm | device | steps | batch | steps/s | peak MiB (CUDA allocated; CPU RSS) "
          "| peak reserved MiB | last train loss | last valid loss |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for arg in argv:
        label, run = arg.split("=", 1)
        print(row(label, Path(run)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
