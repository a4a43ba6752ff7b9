"""`metrics.csv` (one row per step, plus validation rows) and `loss.png`."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

TRAIN_COLUMNS = ("step", "epoch", "split", "loss", "grad_norm", "lr", "samples_per_s", "peak_mem_mib",
                 "peak_reserved_mib")
# columns that measure the machine (time, memory), not the computation: runs that compute the
# same bits may differ here
MEASURED_COLUMNS = ("samples_per_s", "peak_mem_mib", "peak_reserved_mib")


def _format(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # full precision: parity checks compare raw losses
    return str(value)


class MetricsLog:
    """Append-only CSV of training and validation rows, rewritten on resume.

    Columns: step, epoch, split (train | valid), loss, grad_norm, lr, samples_per_s,
    peak_mem_mib (the largest rank's peak since the previous row: CUDA max allocated, CPU
    peak resident set), peak_reserved_mib (CUDA's allocator, empty on CPU), then `extra_columns` (the SDC counters when diagnostics.sdc is on), then rmse_<var> and
    persistence_rmse_<var> for each output variable (validation rows).
    """

    def __init__(self, path: str | Path, variables: Sequence[str], resume_step: int | None,
                 extra_columns: Sequence[str] = ()) -> None:
        self.path = Path(path)
        self.columns = list(TRAIN_COLUMNS) + list(extra_columns)
        self.columns += [f"rmse_{v}" for v in variables]
        self.columns += [f"persistence_rmse_{v}" for v in variables]
        kept: list[dict[str, str]] = []
        if resume_step is not None and self.path.exists():
            # Rows after the checkpoint belong to steps that will be recomputed.
            with self.path.open(newline="") as f:
                kept = [row for row in csv.DictReader(f) if int(row["step"]) <= resume_step]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(kept)

    def log(self, row: Mapping[str, object]) -> None:
        unknown = set(row) - set(self.columns)
        if unknown:
            raise KeyError(f"metrics columns {sorted(unknown)} are not in {self.columns}")
        with self.path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            writer.writerow({k: _format(v) for k, v in row.items()})


def read_metrics(path: str | Path, split: str = "train") -> list[dict[str, str]]:
    with Path(path).open(newline="") as f:
        return [row for row in csv.DictReader(f) if row["split"] == split]


def plot_loss(metrics_path: str | Path, out_path: str | Path) -> None:
    """Training loss per step (log scale) with validation loss points. A bare Figure (no
    pyplot, no tight_layout: ~1 s less at the end of every run) with fixed margins."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import LogFormatter

    train = read_metrics(metrics_path, "train")
    valid = read_metrics(metrics_path, "valid")
    fig = Figure(figsize=(7, 4))
    fig.subplots_adjust(left=0.17, right=0.97, bottom=0.13, top=0.96)
    ax = fig.add_subplot()
    ax.plot([int(r["step"]) for r in train], [float(r["loss"]) for r in train], label="train")
    points = [(int(r["step"]), float(r["loss"])) for r in valid if r["loss"]]
    if points:
        ax.plot(*zip(*points), "o", label="validation")
    ax.set_yscale("log")
    # plain-text tick labels: the default log labels are mathtext, whose font search warns on
    # every run where matplotlib ships only the DejaVu fonts (3.11 and later)
    ax.yaxis.set_major_formatter(LogFormatter())
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    ax.set_xlabel("step")
    ax.set_ylabel("latitude-weighted MSE (normalized)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.savefig(out_path, dpi=100)

