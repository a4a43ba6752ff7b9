"""Members per second of ensemble training at 1, 2 and 4 ranks, for the two placements of a
sample's members (docs/ensembles.md): all on one rank (the batch axis, ranks taking
different samples) and spread over ranks (the mesh's ensemble axis,
`trainer.parallelism.ensemble` = min(ranks, members), the rest data-parallel).

    python benchmarks/ensemble.py [--members 4] [--steps 6] [--repeat 1] [--ranks 1,2,4]
                                  [--device cpu|cuda] [--out FILE]

CREDIT's `crossformer-ensemble` at a small size (stage widths 8..64) on a generated 16x32
dataset, fast mode, FSDP2 over the ranks, one global batch of 4 samples, `OMP_NUM_THREADS=1`
a rank. Each launch trains `--steps` steps; members per second is the median over the steps
after the first two of metrics.csv's samples_per_s x members. The launches run interleaved
(each rank count, both placements, then the reverse order). Prints the machine (the CPU
model, or on `--device cuda` the GPU: one rank a GPU, so the GPU kit runs `--ranks 1`).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_name  # noqa: E402

MODEL = ["model=crossformer-ensemble", "model.dim=[8,16,32,64]", "model.dim_head=4",
         "model.local_window_size=[2,2,2,1]", "model.global_window_size=[2,2,1,1]", "model.noise_latent_dim=8",
         "model.freeze=false"]
DATA = ["data.generate_if_missing=false", "data.levels=[500,850]", "data.train_period=[2000-01-01,2000-01-12]",
        "data.valid_period=[2001-01-01,2001-01-12]", "data.valid_samples=4"]
GLOBAL_BATCH = 4


def members_per_second(data: Path, run: Path, ranks: int, spread: int, members: int, steps: int,
                       device: str = "cpu") -> float:
    """One launch on `ranks` ranks with each sample's members over `spread` of them."""
    dp = ranks // spread
    layout = ["trainer.parallelism.data=fsdp2"] if ranks > 1 else ["trainer.parallelism.data=none"]
    command = [sys.executable, "-m", "credit.cli", "train", "--nproc", str(ranks), *MODEL, *DATA, *layout,
               f"data.root={data}", f"trainer.batch_size={GLOBAL_BATCH // dp}", f"trainer.ensemble_size={members}",
               f"trainer.parallelism.ensemble={spread}", "trainer.loss.function=kcrps", f"trainer.max_steps={steps}",
               "trainer.valid_every_n_steps=0", "trainer.checkpoint.every_n_steps=0", "trainer.progress_bar=false",
               f"trainer.device={device}", f"run_dir={run}"]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if result.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    with open(run / "metrics.csv") as f:
        rates = [float(r["samples_per_s"]) for r in csv.DictReader(f) if r["split"] == "train"][2:]
    return statistics.median(rates) * members


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the interleaved order")
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    args = parser.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")]
    cases = [(count, spread) for count in ranks
             for spread in dict.fromkeys((1, max(d for d in range(1, count + 1)
                                                  if count % d == 0 and args.members % d == 0)))]
    results: dict[tuple[int, int], list[float]] = {case: [] for case in cases}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        subprocess.run([sys.executable, "-m", "credit.cli", "data", "generate", "--out", str(data), "--grid", "16x32",
                        "--years", "2000", "2001", "--levels", "500", "850", "--train-years", "2000",
                        "--days-per-year", "12", "--no-progress"], check=True, capture_output=True)
        order = [*cases, *reversed(cases)] * args.repeat
        for i, (count, spread) in enumerate(order):
            results[count, spread].append(members_per_second(data, Path(tmp) / f"run{i}", count, spread,
                                                             args.members, args.steps, args.device))
    machine = cpu_name() if args.device == "cpu" else _gpu_name()
    lines = [f"{machine}, {os.cpu_count()} CPU cores, OMP_NUM_THREADS=1 a rank; crossformer-ensemble (widths 8..64) "
             f"on 16x32, {args.members} members a sample, global batch {GLOBAL_BATCH}, fast mode, FSDP2; median of "
             f"steps 3..{args.steps} per launch, medians of {len(order) // len(cases)} launches, interleaved",
             "| ranks | members of a sample on | (dp, ens) | members / s | vs 1 rank |",
             "| ---: | --- | --- | ---: | ---: |"]
    base = statistics.median(results[cases[0]])
    for count, spread in cases:
        value = statistics.median(results[count, spread])
        where = "one rank" if spread == 1 else f"{spread} ranks"
        lines.append(f"| {count} | {where} | ({count // spread}, {spread}) | {value:.1f} | {value / base:.2f}x |")
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name()


if __name__ == "__main__":
    main()
