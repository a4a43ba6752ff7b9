#!/usr/bin/env python3
"""Are two `credit train` runs the same bits? Compares every metrics.csv value (except the
throughput and memory measured) and every tensor of each run's latest complete checkpoint (model, EMA,
optimizer state, gathered to full tensors from whatever layout saved them).

    python manual_tests/determinism/compare_runs.py REF_RUN OTHER_RUN [--state-only]

Prints one line per check and the checkpoint's tensor counts by part; exit 0 when both are
identical, 1 when anything differs, 2 when a directory is not a finished run. --state-only (for a resumed run, whose metrics.csv
repeats the steps redone after the restart): only every tensor of REF's final checkpoint,
which OTHER's must contain.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import OrderedDict
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from credit.train.metrics import MEASURED_COLUMNS


def metrics(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv") as f:
        return [{k: v for k, v in row.items() if k not in MEASURED_COLUMNS} for row in csv.DictReader(f)]


_STATES: OrderedDict[tuple[str, int], dict[str, torch.Tensor]] = OrderedDict()


def final_state(run: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the run's latest `step_N` checkpoint, by dotted key. Read once per
    checkpoint as written (a process comparing one reference with many runs reads it once)."""
    checkpoint = max((p for p in (run / "checkpoints").glob("step_*") if p.name[5:].isdigit()),
                     key=lambda p: int(p.name[5:]))
    key = (str(checkpoint.resolve()), (checkpoint / ".metadata").stat().st_mtime_ns)
    if key in _STATES:
        _STATES.move_to_end(key)
    else:
        _STATES[key] = _read(checkpoint)
        while len(_STATES) > 2:  # the reference and the run compared with it: a state is large
            _STATES.popitem(last=False)
    return _STATES[key]


def _read(checkpoint: Path) -> dict[str, torch.Tensor]:
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif isinstance(value, torch.Tensor):
            flat[prefix] = value

    # what dcp_to_torch_save does, without writing the whole state to a file and reading it back
    state: dict = {}
    _load_state_dict(state, storage_reader=FileSystemReader(checkpoint), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    walk("", state)
    return flat


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ref", type=Path)
    parser.add_argument("other", type=Path)
    parser.add_argument("--state-only", action="store_true")
    args = parser.parse_args(argv)
    for run in (args.ref, args.other):
        if not (run / "metrics.csv").is_file() or not any((run / "checkpoints").glob("step_*")):
            print(f"error: {run} is not a finished run (needs metrics.csv and checkpoints/step_*)",
                  file=sys.stderr)
            return 2
    same_metrics = args.state_only or metrics(args.ref) == metrics(args.other)
    if not args.state_only:
        print("every metrics.csv value (losses, grad norms, lr, validation):",
              "identical" if same_metrics else "DIFFERENT")
    ref, got = final_state(args.ref), final_state(args.other)
    if args.state_only:
        got = {k: v for k, v in got.items() if k in ref}
    parts = {part: sum(k.split(".")[0] == part for k in ref) for part in sorted({k.split(".")[0] for k in ref})}
    different = sorted(set(ref) ^ set(got)) + [k for k in ref if k in got and not torch.equal(ref[k], got[k])]
    counts = ", ".join(f"{part} {n}" for part, n in parts.items())
    print(f"final checkpoint ({len(ref)} tensors: {counts}):",
          "bitwise" if not different else f"DIFFERENT: {different[:5]}")
    return 0 if same_metrics and not different else 1


if __name__ == "__main__":
    sys.exit(main())
