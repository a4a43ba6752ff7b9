#!/usr/bin/env python3
"""CREDIT's `tisr` source: one field's time, computed as `credit.interop.tisr.integrated` does
(the hour angle's cosine per longitude, the grid in cache-sized blocks of rows) against CREDIT's
layout (every point of a (steps + 1, lat, lon) tensor at once, one trapezoidal sum), samples
interleaved, on one thread (a data-loader worker's), and the largest difference between them.

CREDIT's `TISRDataset` computes a field for every input frame of every sample, so this is a
data-loader cost per frame: at 1 degree with CREDIT's 6-hourly `num_integration_steps: 2160`
it matters beside a GPU step of a fraction of a second.

    python benchmarks/tisr.py [--grids 181x360,721x1440] [--steps 2160] [--repeat 3] [--max-gib 2]
                              [--out FILE]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_name  # noqa: E402

from credit.interop import tisr  # noqa: E402


def credit_layout(t, period, steps, lat, lon, tsi_times, tsi) -> torch.Tensor:
    """CREDIT's layout: the whole (steps + 1, lat, lon) irradiance, then one trapezoidal sum."""
    times = pd.date_range(end=t, periods=steps + 1, freq=period / steps)
    return torch.trapz(tisr.instantaneous(times, lat, lon, tsi_times, tsi), dx=period / steps / pd.Timedelta(seconds=1),
                       dim=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", default="181x360")
    parser.add_argument("--steps", type=int, default=2160)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-gib", type=float, default=2.0,
                        help="skip CREDIT's layout where one of its tensors would be larger")
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    years = np.arange(1990.5, 2060.5, dtype=np.float32)
    tsi_times, tsi = torch.from_numpy(years), torch.full((len(years),), 1361.0)
    lines = [f"# tisr: one field, {args.steps} steps over 6 h, one thread", "",
             f"Machine: {cpu_name()}, torch {torch.__version__}, 1 thread; {args.repeat} interleaved pairs.", "",
             "| grid | here (s) | CREDIT's layout (s) | ratio | largest difference (J m-2) |",
             "| --- | --- | --- | --- | --- |"]
    for grid in args.grids.split(","):
        h, w = (int(n) for n in grid.split("x"))
        lat, lon = tisr.grid_from_specs([90, -90, h], [0, 360 - 360 / w, w], "grid")
        call = (pd.Timestamp("2001-01-01T06:00"), pd.Timedelta("6h"), args.steps, lat, lon, tsi_times, tsi)
        tensor_gib = (args.steps + 1) * h * w * 4 / 2 ** 30
        sides = [(tisr.integrated, [])]
        if tensor_gib <= args.max_gib:
            sides.append((credit_layout, []))
        for _ in range(args.repeat):
            for fn, times in sides:
                start = time.perf_counter()
                value = fn(*call)
                times.append(time.perf_counter() - start)
                del value
        a = statistics.median(sides[0][1])
        if len(sides) == 2:
            difference = float((tisr.integrated(*call) - credit_layout(*call)).abs().max())
            b = statistics.median(sides[1][1])
            lines.append(f"| {h}x{w} | {a:.2f} | {b:.2f} | {b / a:.2f}x | {difference:g} |")
        else:
            lines.append(f"| {h}x{w} | {a:.2f} | not run: its ({args.steps + 1}, {h}, {w}) float32 tensor is "
                         f"{tensor_gib:.1f} GiB, and several are live at once (--max-gib {args.max_gib:g}) | | |")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    lines += ["", f"Peak resident memory of the process: {peak:.1f} GiB.", "",
              f"Reproduce: `python benchmarks/tisr.py --grids {args.grids} --steps {args.steps} "
              f"--repeat {args.repeat}`"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
