#!/usr/bin/env python3
"""The train step's memory at CREDIT's sizes without a GPU: deterministic against fast, with
the deterministic convolutions on the matrix path a GPU takes, replayed on the CPU.

On the CPU the deterministic convolutions run as gather GEMMs that never form an im2col
matrix; on a GPU they run the matrix path (`credit.models.deterministic.layers`: im2col rows
times the GEMM, in slabs where the rows pass `slabs.SLAB_BYTES`). This benchmark forces that
path (its products by torch.matmul: the same tensors, not the Triton kernels' own split
buffers of at most 64 MiB a launch) and reports, per class and mode, the step's peak above
its start from torch's CPU allocator events (`plan_accuracy.step_peaks`'s walk), and the
largest tensors live at that peak with the functions that made them. The default GPU step
of `benchmarks/step_at_size.py` measures the same on a GPU; this one says where the bytes
are, on any machine.

    python benchmarks/step_memory.py --section benchmarks/configs/wxformer_1deg.yml \\
        [--models wxformer,crossformer,nextgen_wxformer] [--top 5] [--out FILE] [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))  # the benchmarks' own helpers
from determinism import report  # noqa: E402
from machine import cpu_name  # noqa: E402
from plan_accuracy import _walk  # noqa: E402
from step_at_size import Mode, class_overrides, load_section  # noqa: E402


def _maker(event) -> str:
    """The autograd function or module call an allocation happened in, and its operator."""
    names, parent = [], event.parent
    while parent is not None and len(names) < 3:
        if not parent.name.startswith("aten::") or not names:
            names.append(parent.name.removeprefix("autograd::engine::evaluate_function: ")[:48])
        parent = parent.parent
    return " < ".join(names) or "(outside any operator)"


def step_peak(mode: Mode, top: int) -> tuple[int, list[tuple[str, int]]]:
    """(bytes of the step's peak above its start, the `top` largest makers live at it)."""
    mode.step()  # the optimizer state exists from here on
    mode.optimizer.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        mode.step()
    events = sorted((e for e in _walk(prof.profiler.kineto_results.experimental_event_tree())
                     if e.tag == _EventType.Allocation), key=lambda e: e.start_time_ns)
    live: dict[int, object] = {}
    now = peak = 0
    at_peak: dict[int, object] = {}
    for event in events:
        fields = event.extra_fields
        if fields.alloc_size > 0:
            live[fields.ptr] = event
        else:
            live.pop(fields.ptr, None)
        now += fields.alloc_size
        if now > peak:
            peak, at_peak = now, dict(live)
    makers: collections.Counter = collections.Counter()
    for event in at_peak.values():
        makers[_maker(event)] += event.extra_fields.alloc_size
    return peak, makers.most_common(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--section", type=Path, required=True, help="a YAML file with a CREDIT model: section")
    parser.add_argument("--models", default="", help="classes to build at the section's sizes (default: its own)")
    parser.add_argument("--top", type=int, default=5, help="largest makers listed per step")
    parser.add_argument("--out", type=Path)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args()
    section = load_section(args.section)
    from credit.models.deterministic import layers

    layers._BACKEND = "reference"  # the matrix path: what resolves to triton on a GPU
    classes = [c for c in args.models.split(",") if c] or [None]
    table = ["| class | deterministic step peak (GiB) | fast step peak (GiB) | det / fast |", "| --- | --- | --- | --- |"]
    details = []
    for model_class in classes:
        name = model_class or section.get("type", "?")
        overrides = [*class_overrides(section, model_class), *args.overrides]
        peaks = {}
        for mode in ("deterministic", "fast"):
            peaks[mode], makers = step_peak(Mode(overrides, mode, torch.device("cpu"), 1), args.top)
            details += ["", f"## {name}, {mode}: the largest makers live at the peak", "",
                        "| made in | GiB |", "| --- | --- |",
                        *(f"| {maker.replace('|', '/')} | {size / 2**30:.3f} |" for maker, size in makers)]
        table.append(f"| {name} | {peaks['deterministic'] / 2**30:.2f} | {peaks['fast'] / 2**30:.2f} | "
                     f"{peaks['deterministic'] / peaks['fast']:.2f}x |")
        print(table[-1], flush=True)
    lines = [
        f"# Train step memory at the size of {args.section} (batch 1), the GPU's convolution path on the CPU",
        "",
        f"Machine: {cpu_name()}, torch {torch.__version__}; fp32; a step's peak above its start (parameters, "
        "optimizer state and the batch held before it are not counted), from torch's CPU allocator events; the "
        "deterministic convolutions on the matrix path with torch.matmul products; norms and linear layers "
        "through the CPU's deterministic kernels.",
        "",
        *table,
        "",
        f"Reproduce: `python benchmarks/step_memory.py --section {args.section}"
        f"{' --models ' + args.models if args.models else ''}{''.join(' ' + o for o in args.overrides)}`",
        *details,
    ]
    report(lines, args.out)


if __name__ == "__main__":
    main()
