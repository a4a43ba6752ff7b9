"""The command line of `credit plan` (see `main`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from credit.plan.report import plan_rows, render

USAGE = """credit plan [--gpus 1,2,4,8] [--gpu-memory 80] [--usable 0.9] [--global-batch B]
                   [--grid NLATxNLON] [--credit-config CREDIT.yml] [--out FILE.md] [KEY=VALUE ...]"""


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--gpus {text!r}: comma-separated whole numbers >= 1, e.g. 1,2,4,8")
    return counts


def _grid(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"--grid {text!r}: NLATxNLON, e.g. 721x1440")
    return int(parts[0]), int(parts[1])


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number > 0")
    return value


def _fraction(text: str) -> float:
    value = _positive(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a fraction in (0, 1]")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one error line from the caller, not usage + message
        raise ValueError(f"credit plan: {message} (credit plan --help)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="credit plan", usage=USAGE,
        description="Per-rank memory and communication of every (dp, tp, sequence-parallel, FSDP2/DDP) "
                    "layout of the config on N GPUs, traced under fake tensors and a fake process group "
                    "(nothing is allocated or sent); prints a markdown table and the layouts that fit.")
    parser.add_argument("--gpus", type=_counts, default=[1, 2, 4, 8], help="GPU counts (default 1,2,4,8)")
    parser.add_argument("--gpu-memory", type=_positive, default=80.0, help="GiB of one GPU (default 80)")
    parser.add_argument("--usable", type=_fraction, default=0.9,
                        help="fraction of it a step may peak at: the rest is the CUDA context, communication "
                             "buffers and the allocator's fragmentation (default 0.9)")
    parser.add_argument("--global-batch", type=int, help="samples per optimizer step (default: GPUs x "
                        "trainer.batch_size x trainer.grad_accum_steps)")
    parser.add_argument("--grid", type=_grid, help="NLATxNLON, unless model.image_height/image_width are set")
    parser.add_argument("--credit-config", type=Path, help="take the model from a CREDIT config's model: section")
    parser.add_argument("--out", type=Path, help="also write the table to this file (a new path)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    return parser


def main(argv: Sequence[str]) -> int:
    """Run `credit plan`. A bad argument or config raises ValueError or ConfigError (the
    command prints it as one `error:` line), before anything is traced or written."""
    args = _parser().parse_args(list(argv))
    if args.global_batch is not None and args.global_batch < 1:
        raise ValueError(f"--global-batch {args.global_batch} must be >= 1")
    if args.out is not None and args.out.exists():
        raise FileExistsError(f"{args.out} already exists; refusing to overwrite it (choose a new path)")
    if args.out is not None and not args.out.parent.is_dir():
        raise FileNotFoundError(f"--out {args.out}: the folder {args.out.parent} does not exist")
    overrides = list(args.overrides)
    if args.credit_config is not None:
        from credit.interop.checkpoint_import import model_overrides
        from credit.models.credit.checkpoint import read_credit_model_section
        from credit.models.credit.config import resolve_credit_model

        if not args.credit_config.is_file():
            raise FileNotFoundError(f"--credit-config {args.credit_config} is not a file")
        overrides = [*model_overrides(*resolve_credit_model(read_credit_model_section(args.credit_config))),
                     *overrides]
    rows = plan_rows(overrides, args.gpus, args.grid, args.global_batch, progress=not args.no_progress)
    text = render(rows, args.gpu_memory, args.usable, "credit plan " + " ".join(argv))
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)
    return 0
