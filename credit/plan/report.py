"""`credit plan`: every (dp, ens, tp, sequence-parallel, FSDP2/DDP) layout of N GPUs for a config,
with its traced per-rank memory and communication, and the layouts that fit a GPU.

Each layout is the config with `trainer.parallelism.tensor`, `.ensemble` (an ensemble's),
`.data` and `.sequence_parallel` set and `trainer.batch_size` = global batch / (dp x grad_accum_steps), composed and validated
as `credit train` would, then traced (`credit.plan.trace`). A layout the config rules refuse,
or that parallelisation refuses, is a row saying why.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from credit.config import ConfigError, compose_config
from credit.config.validate import SEQUENCE_PARALLEL_MODELS
from credit.models import build_model
from credit.plan.shapes import SampleShapes, sample_shapes
from credit.plan.trace import StepTrace, check_traceable, trace_step

GIB = 2**30


@dataclass(frozen=True)
class Layout:
    world: int
    tp: int
    data: str  # fsdp2 | ddp | none (one process)
    sequence_parallel: bool
    ens: int = 1  # ranks a sample's members are spread over (trainer.parallelism.ensemble)

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.ens)

    @property
    def name(self) -> str:
        ens = f"×ens{self.ens}" if self.ens > 1 else ""
        return f"dp{self.dp}{ens}×tp{self.tp}{'+sp' if self.sequence_parallel else ''}"


@dataclass
class Row:
    layout: Layout
    batch_per_rank: int | None = None
    trace: StepTrace | None = None
    refused: str | None = None  # why the layout cannot run


def layouts(world: int, sequence_parallel: bool, members: int = 1) -> list[Layout]:
    """Every layout of `world` ranks: tp over the divisors of `world`, an ensemble's members
    (`members` > 1) over the divisors of both the rest and `members`, FSDP2 or DDP over what
    remains, with and without sequence parallelism (`sequence_parallel`: the model has it)."""
    if world == 1:
        return [Layout(1, 1, "none", False)]
    found = []
    for tp in (d for d in range(1, world + 1) if world % d == 0):
        for ens in (e for e in range(1, world // tp + 1) if (world // tp) % e == 0 and members % e == 0):
            for data in ("fsdp2", "ddp"):
                for sp in ((False, True) if tp > 1 and sequence_parallel else (False,)):
                    found.append(Layout(world, tp, data, sp, ens))
    return found


class Rows(list):
    """The traced rows, and `model`: a line naming the model and its parameter count."""

    model: str = ""


def plan_rows(overrides: Sequence[str], gpus: Sequence[int], grid: tuple[int, int] | None = None,
              global_batch: int | None = None, progress: bool = True) -> Rows:
    """Trace every layout of each number of GPUs in `gpus`. `global_batch` (samples per
    optimizer step) defaults to each count's GPUs x trainer.batch_size x grad_accum_steps.
    The returned list's `model` attribute names the model and its parameter count."""
    # the layouts set the data parallelism; the base config needs one its other keys allow (bf16)
    base = compose_config([*overrides, "trainer.parallelism.data=fsdp2"])
    check_traceable(base)
    shapes = sample_shapes(base, grid)
    with torch.device("meta"):  # a model that cannot be built on this grid: one error, not a row per layout
        model = build_model(base.model, **shapes.layout())
    accum = base.trainer.grad_accum_steps
    todo = [(world, layout) for world in gpus
            for layout in layouts(world, base.model.name in SEQUENCE_PARALLEL_MODELS, base.trainer.ensemble_size)]
    rows = Rows()
    rows.model = (f"model: {base.model.name} on a {shapes.grid[0]}x{shapes.grid[1]} grid, "
                  f"{sum(p.numel() for p in model.parameters()):,} parameters")
    package_log = logging.getLogger("credit")
    level = package_log.level
    package_log.setLevel(logging.WARNING)  # parallelisation's log lines, once per trace
    try:
        for world, layout in tqdm(todo, desc="tracing layouts", unit="layout", disable=not progress):
            rows.append(_row(overrides, shapes, world, layout, global_batch or world * base.trainer.batch_size * accum,
                             accum))
    finally:
        package_log.setLevel(level)
    return rows


def _row(overrides: Sequence[str], shapes: SampleShapes, world: int, layout: Layout, batch: int, accum: int) -> Row:
    row = Row(layout)
    if batch % (layout.dp * accum):
        row.refused = f"a global batch of {batch} does not split over dp={layout.dp} x grad_accum_steps={accum}"
        return row
    row.batch_per_rank = batch // (layout.dp * accum)
    # one process builds no mesh, so it has no mixed precision (trainer.parallelism.mixed_precision)
    alone = ["trainer.parallelism.mixed_precision=none"] if world == 1 else []
    try:
        cfg = compose_config([*overrides, *alone, f"trainer.parallelism.tensor={layout.tp}",
                              f"trainer.parallelism.ensemble={layout.ens}",
                              f"trainer.parallelism.data={layout.data}",
                              f"trainer.parallelism.sequence_parallel={str(layout.sequence_parallel).lower()}",
                              f"trainer.batch_size={row.batch_per_rank}"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's warnings about the traced run, once per trace
            row.trace = trace_step(cfg, shapes, world)
    except (ConfigError, ValueError, NotImplementedError) as error:  # the rules' refusals
        row.refused = str(error).splitlines()[0]
    except (RuntimeError, AssertionError) as error:  # torch's, from deeper down: named, and the plan goes on
        row.refused = f"{type(error).__name__}: {(str(error).strip().splitlines() or ['(no message)'])[0]}"
    return row


def _figure(value: float) -> str:
    """Three digits that line up in a column: 123.4, 12.34, 1.234, 0.123."""
    return f"{value:.1f}" if value >= 100 else f"{value:.2f}" if value >= 10 else f"{value:.3f}"


def _gib(value: float) -> str:
    return _figure(value / GIB)


def render(rows: Sequence[Row], gpu_memory_gib: float, usable: float, title: str) -> str:
    """A markdown table of `rows` and the layouts whose peak fits `usable` x the GPU's memory."""
    limit = usable * gpu_memory_gib * GIB
    lines = [f"## {title}", "", *([rows.model, ""] if isinstance(rows, Rows) and rows.model else []),
             f"Per rank, GiB (2^30 bytes); sent: GB (10^9 bytes) one rank sends per step (ring algorithms), "
             f"within its tensor-parallel group (tp) and across data-parallel replicas (dp, including groups "
             f"of every rank and an ensemble's ens groups); step: the step's own memory above what is held; "
             f"fits: the peak within {usable:.0%} of {gpu_memory_gib:g} GiB.", "",
             "| GPUs | layout | data | batch/rank | params | grads | optimizer | held | step | peak | tp sent | "
             "dp sent | collectives tp/dp | fits |",
             "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    groups: dict[object, list[Row]] = {}  # the variants of a (GPUs, tp) refused alike share a line
    for row in rows:
        key = (row.layout.world, row.layout.tp, row.layout.ens, row.refused) if row.trace is None else id(row)
        groups.setdefault(key, []).append(row)
    lines += [_trace_line(group[0], limit) if group[0].trace is not None else _refused_line(group)
              for group in groups.values()]
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


def _refused_line(rows: list[Row]) -> str:
    first = rows[0].layout
    ens = f"×ens{first.ens}" if first.ens > 1 else ""
    name = f"dp{first.dp}{ens}×tp{first.tp}" + (" (±sp)" if any(r.layout.sequence_parallel for r in rows) else "")
    data = ", ".join(dict.fromkeys(r.layout.data for r in rows))
    return (f"| {first.world} | {name} | {data} | {rows[0].batch_per_rank or '-'} "
            f"| cannot run: {rows[0].refused} |" + " |" * 9)


def _trace_line(row: Row, limit: float) -> str:
    layout, trace = row.layout, row.trace
    head = f"| {layout.world} | {layout.name} | {layout.data} | {row.batch_per_rank or '-'} "
    tp_sent = trace.sent.get("tp", 0.0)
    dp_sent = sum(sent for group, sent in trace.sent.items() if group != "tp")
    tp_calls = trace.collectives.get("tp", 0)
    dp_calls = sum(calls for group, calls in trace.collectives.items() if group != "tp")
    return (head + f"| {_gib(trace.params)} | {_gib(trace.grads)} | {_gib(trace.optimizer)} "
            f"| {_gib(trace.held)} | {_gib(trace.activation)} | {_gib(trace.peak)} "
            f"| {_figure(tp_sent / 1e9)} | {_figure(dp_sent / 1e9)} | {tp_calls}/{dp_calls} "
            f"| {'yes' if trace.peak <= limit else 'no'} |")
