"""`credit plan`: every (dp, tp, sequence-parallel, FSDP2/DDP) layout of N GPUs for a config,
with its traced per-rank memory and communication, and the layouts that fit a GPU.

Each layout is the config with `trainer.parallelism.tensor`, `.data` and `.sequence_parallel`
set and `trainer.batch_size` = global batch / (dp x grad_accum_steps), composed and validated
as `credit train` would, then traced (`credit.plan.trace`). A layout the config rules refuse,
or that parallelisation refuses, is a row saying why.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from tqdm import tqdm

from credit.config import ConfigError, compose_config
from credit.config.validate import SEQUENCE_PARALLEL_MODELS
from credit.plan.shapes import sample_shapes
from credit.plan.trace import StepTrace, trace_step

GIB = 2**30


@dataclass(frozen=True)
class Layout:
    world: int
    tp: int
    data: str  # fsdp2 | ddp | none (one process)
    sequence_parallel: bool

    @property
    def dp(self) -> int:
        return self.world // self.tp

    @property
    def name(self) -> str:
        return f"dp{self.dp}×tp{self.tp}{'+sp' if self.sequence_parallel else ''}"


@dataclass
class Row:
    layout: Layout
    batch_per_rank: int | None = None
    trace: StepTrace | None = None
    refused: str | None = None  # why the layout cannot run


def layouts(world: int, sequence_parallel: bool) -> list[Layout]:
    """Every layout of `world` ranks: tp over the divisors of `world`, FSDP2 or DDP over the
    rest, with and without sequence parallelism (`sequence_parallel`: the model has it)."""
    if world == 1:
        return [Layout(1, 1, "none", False)]
    found = []
    for tp in (d for d in range(1, world + 1) if world % d == 0):
        for data in ("fsdp2", "ddp"):
            for sp in ((False, True) if tp > 1 and sequence_parallel else (False,)):
                found.append(Layout(world, tp, data, sp))
    return found


def plan_rows(overrides: Sequence[str], gpus: Sequence[int], grid: tuple[int, int] | None = None,
              global_batch: int | None = None, progress: bool = True) -> list[Row]:
    """Trace every layout of each number of GPUs in `gpus`. `global_batch` (samples per
    optimizer step) defaults to each count's GPUs x trainer.batch_size x grad_accum_steps."""
    base = compose_config(list(overrides))
    if base.model.gemm == "deterministic":
        raise ConfigError("credit plan traces model.gemm=fast; deterministic mode's exact gradient "
                          "norm reads values, which a fake trace has not: plan with model.gemm=fast "
                          "(the layouts' memory is alike)")
    shapes = sample_shapes(base, grid)
    accum = base.trainer.grad_accum_steps
    todo = [(world, layout) for world in gpus
            for layout in layouts(world, base.model.name in SEQUENCE_PARALLEL_MODELS)]
    rows = []
    logging.getLogger("credit").setLevel(logging.WARNING)  # parallelisation's log lines, once per trace
    for world, layout in tqdm(todo, desc="tracing layouts", unit="layout", disable=not progress):
        batch = global_batch or world * base.trainer.batch_size * accum
        row = Row(layout)
        rows.append(row)
        if batch % (layout.dp * accum):
            row.refused = (f"a global batch of {batch} does not split over dp={layout.dp} x "
                           f"grad_accum_steps={accum}")
            continue
        row.batch_per_rank = batch // (layout.dp * accum)
        # one process builds no mesh, so it has no mixed precision (trainer.parallelism.mixed_precision)
        alone = ["trainer.parallelism.mixed_precision=none"] if world == 1 else []
        try:
            cfg = compose_config([*overrides, *alone, f"trainer.parallelism.tensor={layout.tp}",
                                  f"trainer.parallelism.data={layout.data}",
                                  f"trainer.parallelism.sequence_parallel={str(layout.sequence_parallel).lower()}",
                                  f"trainer.batch_size={row.batch_per_rank}"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's warnings about the traced run, once per trace
                row.trace = trace_step(cfg, shapes, world)
        except (ConfigError, ValueError, NotImplementedError) as error:
            row.refused = str(error).splitlines()[0]
    return rows


def _gib(value: float) -> str:
    return f"{value / GIB:.3g}"


def render(rows: Sequence[Row], gpu_memory_gib: float, usable: float, title: str) -> str:
    """A markdown table of `rows` and the layouts whose peak fits `usable` x the GPU's memory."""
    limit = usable * gpu_memory_gib * GIB
    lines = [f"## {title}", "",
             f"Per rank, GiB (2^30 bytes); sent: GB (10^9 bytes) one rank sends per step (ring algorithms), "
             f"within its tensor-parallel group (tp) and across data-parallel replicas (dp); fits: the peak "
             f"within {usable:.0%} of {gpu_memory_gib:g} GiB.", "",
             "| GPUs | layout | data | batch/rank | params | grads | optimizer | held | step | peak | tp sent | "
             "dp sent | fits |",
             "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in rows:
        lay = row.layout
        head = f"| {lay.world} | {lay.name} | {lay.data} | {row.batch_per_rank or '-'} "
        if row.trace is None:
            lines.append(head + f"| cannot run: {row.refused} |" + " |" * 8)
            continue
        t = row.trace
        tp_sent = t.sent.get("tp", 0.0)
        dp_sent = sum(v for k, v in t.sent.items() if k != "tp")
        lines.append(head + f"| {_gib(t.params)} | {_gib(t.grads)} | {_gib(t.optimizer)} | {_gib(t.held)} "
                     f"| {_gib(t.activation)} | {_gib(t.peak)} | {tp_sent / 1e9:.2f} | {dp_sent / 1e9:.2f} "
                     f"| {'yes' if t.peak <= limit else 'no'} |")
    lines.append("")
    for world in dict.fromkeys(row.layout.world for row in rows):
        fitting = [r for r in rows if r.layout.world == world and r.trace is not None and r.trace.peak <= limit]
        if not fitting:
            lines.append(f"- {world} GPU{'s' if world > 1 else ''}: no layout fits.")
            continue
        least = min(fitting, key=lambda r: (sum(r.trace.sent.values()), r.trace.peak))
        names = ", ".join(f"{r.layout.name} {r.layout.data}" for r in fitting)
        lines.append(f"- {world} GPU{'s' if world > 1 else ''}: fit: {names}; least sent: "
                     f"{least.layout.name} {least.layout.data}.")
    return "\n".join(lines) + "\n"
