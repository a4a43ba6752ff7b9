#!/usr/bin/env python3
"""How closely credit's CREDIT models reproduce CREDIT's own forward.

For each reference fixture (tests/fixtures/credit_reference: checkpoints, configs, inputs
and eval-mode outputs made with CREDIT's model code), loads the checkpoint with
`credit.models.from_credit` and prints max |ours - CREDIT| / max |CREDIT|, in one process,
at tp=2 on two gloo ranks (each fixture's first stage has two heads) and with sequence
parallelism at tp=2 (the stages whose rows split run on rows). The acceptance
tests (tests/models/test_credit_models.py, tests/parallel/test_credit_tp.py) hold 1e-5.

    PYTHONPATH=. python benchmarks/credit_parity.py
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "parallel"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from launcher import run_ranks  # noqa: E402  (the suite's one rank launcher)
from test_credit_tp import FIXTURES, NAMES, _tp_forward_backward, relative_difference  # noqa: E402

from credit.models.credit.checkpoint import from_credit  # noqa: E402
from machine import cpu_name  # noqa: E402


def one_process(name: str) -> float:
    model = from_credit(FIXTURES / name / "model.yml", FIXTURES / name / "checkpoint.pt")
    with torch.no_grad():
        out = model(torch.load(FIXTURES / name / "input.pt"))
    return relative_difference(out, torch.load(FIXTURES / name / "output.pt"))


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    logging.getLogger("credit").setLevel(logging.ERROR)  # the fixtures' ignored-key warnings
    print(f"torch {torch.__version__}, {cpu_name()}, {torch.get_num_threads()} threads")
    tp = run_ranks(_tp_forward_backward, 2, NAMES)
    print("| fixture | CREDIT class | one process | tp=2 | tp=2 + sequence parallel |\n"
          "| --- | --- | ---: | ---: | ---: |")
    for name in NAMES:
        worst = max(rank[name][1] for rank in tp)
        worst_sp = max(rank[name + "/sp"][1] for rank in tp)
        kind = yaml.safe_load((FIXTURES / name / "model.yml").read_text())["model"]["type"]
        print(f"| {name} | {kind} | {one_process(name):.2e} | {worst:.2e} | {worst_sp:.2e} |")


if __name__ == "__main__":
    main()
