"""Where a train step's time goes, by operation family, from torch.profiler's events.

Forward: each op counts for the innermost family range it runs in. The ranges are opened
around the model's modules by class (Linear: projections, Conv: convolutions, norms,
dropout, attention, position bias, pixel shuffles), around `resize` and spectral norm's
weight normalisation, around the loss and around the optimizer update (which includes the
gradient clipping). Backward: an autograd node's work counts for the family of the forward
op that created it (the profiler gives both the same sequence number). Collectives count as
collectives wherever they run; the data loader's work as data loading. What is in no range
is "the rest". Host times are self CPU time (each op's own, not its callees'). On a GPU,
device times are the kernels' time, each kernel counted for the family of the op (or
range) that launched it; kernels the profiler links to no CPU event (it links kernels
through the launch's correlation id) are a row of their own, so the rows add up to every
kernel's time.

Hand-written: torch.profiler groups by op name or by the stack of Python frames, not by the
kind of layer an op serves.
"""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.autograd import DeviceType
from torch.autograd.profiler import record_function

PREFIX = "family::"
FAMILIES = ("projections", "convolutions", "resizes and pixel shuffles", "position bias", "attention (rest)",
            "norms", "spectral norm", "dropout masks", "loss", "optimizer and clipping", "collectives",
            "data loading", "the rest")
UNLINKED = "kernels linked to no op"
"""The device table's extra row (see the module docstring)."""
_COLLECTIVE_NAMES = ("c10d", "gloo", "nccl", "all_reduce", "allreduce", "all_gather", "allgather",
                     "reduce_scatter", "broadcast", "_tree_reduce")


def module_family(module: nn.Module) -> str | None:
    """The family a module's own forward work counts for (None: its children decide)."""
    name = type(module).__name__
    if isinstance(module, nn.Linear):
        return "projections"
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d, nn.Conv3d)):
        return "convolutions"
    if isinstance(module, (nn.LayerNorm, nn.GroupNorm)) or name.endswith("LayerNorm") or name.endswith("GroupNorm"):
        return "norms"
    if isinstance(module, nn.Dropout) or "Dropout" in name:
        return "dropout masks"
    if isinstance(module, (nn.PixelShuffle, nn.Upsample)):
        return "resizes and pixel shuffles"
    if name == "DynamicPositionBias":
        return "position bias"
    if name.endswith("Attention"):
        return "attention (rest)"
    return None


def _ranged(family: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def call(*args, **kwargs):
        with record_function(PREFIX + family):
            return fn(*args, **kwargs)

    return call


@contextlib.contextmanager
def family_ranges(trainer) -> Iterator[None]:
    """Open the family ranges around `trainer`'s model, loss and update while inside."""
    import credit.models.credit.convs as convs
    import credit.models.credit.deterministic_attention as det
    import credit.models.credit.layers as layers
    import credit.models.credit.crossformer as crossformer
    import credit.models.credit.wxformer as wxformer
    import credit.models.credit.wxformer_next as wxformer_next
    import credit.train.trainer as trainer_module
    from credit.models.spectral_norm import SpectralNormed

    handles, restore = [], []
    modules = [*trainer.model.modules(), trainer.loss_fn]
    for module in modules:
        family = "loss" if module is trainer.loss_fn else module_family(module)
        if family is None:
            continue
        ranges: list = []

        def enter(mod, args, family=family, ranges=ranges):
            ranges.append(record_function(PREFIX + family).__enter__())

        def leave(mod, args, out, ranges=ranges):
            ranges.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]

    def patch(owner, attr: str, family: str) -> None:
        if hasattr(owner, attr):
            original = getattr(owner, attr)
            restore.append((owner, attr, original))
            setattr(owner, attr, _ranged(family, original))

    for owner in (convs, crossformer, wxformer, wxformer_next):  # each imported the name
        patch(owner, "resize", "resizes and pixel shuffles")
    for owner in {type(m) for m in trainer.model.modules() if hasattr(type(m), "position_bias")}:
        patch(owner, "position_bias", "position bias")
    patch(layers, "gather_position_bias", "position bias")
    patch(det._HeadSharedBias, "apply", "position bias")
    patch(SpectralNormed, "normalized_weight", "spectral norm")
    patch(trainer_module, "update_parameters", "optimizer and clipping")
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for owner, attr, original in reversed(restore):
            setattr(owner, attr, original)


def _range_family(event) -> str | None:
    """The innermost family range around `event` (itself included)."""
    while event is not None:
        if event.name.startswith(PREFIX):
            return event.name[len(PREFIX):]
        event = event.cpu_parent
    return None


def family_times(events, clock: str = "host") -> dict[str, float]:
    """Milliseconds per family over a profiler's `events()`: self CPU time (`clock` "host"),
    or the kernel time of the ops' launches ("device", with the UNLINKED row)."""
    by_sequence: dict[int, str] = {}
    for event in events:  # forward ops that create autograd nodes carry the node's sequence number
        if event.sequence_nr >= 0 and not event.name.startswith("autograd::engine"):
            family = _range_family(event)
            if family is not None:
                by_sequence.setdefault(event.sequence_nr, family)
    totals: dict[str, float] = defaultdict(float)
    device_total = 0.0
    for event in events:
        on_host = event.device_type == DeviceType.CPU
        if clock == "device" and not on_host:  # a kernel, memcpy or memset itself
            device_total += event.self_device_time_total / 1e3
            continue
        if event.name.startswith(PREFIX) and clock == "host":
            continue
        if not on_host:
            continue
        spent = event.self_cpu_time_total if clock == "host" else event.self_device_time_total
        if spent:  # ranges launch kernels too (a Triton launch is no aten op)
            family = _range_family(event) if event.name.startswith(PREFIX) else _classify(event, by_sequence)
            totals[family] += spent / 1e3
    if clock == "host":
        return {family: totals.get(family, 0.0) for family in FAMILIES}
    times = {family: totals.get(family, 0.0) for family in FAMILIES}
    times[UNLINKED] = max(0.0, device_total - sum(times.values()))
    return times


def kernel_times(events) -> dict[str, tuple[float, int]]:
    """(milliseconds, launches) per GPU kernel name over a profiler's `events()`: what the
    device ran, with no attribution to ops (Triton's kernels have no aten op to link to)."""
    totals: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for event in events:
        if event.device_type != DeviceType.CPU and event.self_device_time_total:
            entry = totals[event.name]
            entry[0] += event.self_device_time_total / 1e3
            entry[1] += 1
    return {name: (ms, count) for name, (ms, count) in totals.items()}


def kernel_table(det: dict[str, tuple[float, int]], fast: dict[str, tuple[float, int]], top: int = 15) -> list[str]:
    """Markdown rows: each mode's `top` kernels by time, side by side, and each mode's total."""
    def ranked(times: dict[str, tuple[float, int]]) -> list[tuple[str, float, int]]:
        return sorted(((name, ms, n) for name, (ms, n) in times.items()), key=lambda row: -row[1])[:top]

    def short(name: str) -> str:
        return name.replace("|", "/")[:70]

    lines = ["| rank | deterministic kernel | ms | launches | fast kernel | ms | launches |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    left, right = ranked(det), ranked(fast)
    for i in range(max(len(left), len(right))):
        a = left[i] if i < len(left) else ("", None, None)
        b = right[i] if i < len(right) else ("", None, None)
        cells = [str(i + 1), short(a[0]), "" if a[1] is None else f"{a[1]:.1f}", "" if a[2] is None else str(a[2]),
                 short(b[0]), "" if b[1] is None else f"{b[1]:.1f}", "" if b[2] is None else str(b[2])]
        lines.append("| " + " | ".join(cells) + " |")
    total = [sum(ms for ms, _ in t.values()) for t in (det, fast)]
    launches = [sum(n for _, n in t.values()) for t in (det, fast)]
    lines.append(f"| **all kernels** | | {total[0]:.1f} | {launches[0]} | | {total[1]:.1f} | {launches[1]} |")
    return lines


def _classify(event, by_sequence: dict[int, str]) -> str:
    lowered = event.name.lower()
    if any(name in lowered for name in _COLLECTIVE_NAMES):
        return "collectives"
    node = event
    while node is not None:
        if node.name.startswith("enumerate(DataLoader)"):
            return "data loading"
        if node.name.startswith("autograd::engine::evaluate_function"):
            family = by_sequence.get(node.sequence_nr)
            return family if family is not None else "the rest"
        node = node.cpu_parent
    family = _range_family(event)
    return family if family is not None else "the rest"


def profile_step(trainer, batches) -> dict[str, dict[str, float]]:
    """One train step of `trainer` under the profiler: milliseconds per family, "host" (self
    CPU time) and, on a GPU, "device" (kernel time)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = trainer.runtime.device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with family_ranges(trainer), profile(activities=activities) as prof:
        trainer.train_step(batches)
        if cuda:
            torch.cuda.synchronize(trainer.runtime.device)
    events = prof.events()
    return {"host": family_times(events), **({"device": family_times(events, "device")} if cuda else {})}


def merge(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per family (or row), the median over profiled steps."""
    import statistics

    return {row: statistics.median(run[row] for run in runs) for row in runs[0]}


def table(det: dict[str, float], fast: dict[str, float]) -> list[str]:
    """Markdown rows: family, deterministic ms, fast ms, their difference and its share of the gap."""
    gap = sum(det.values()) - sum(fast.values())
    lines = ["| family | deterministic (ms) | fast (ms) | difference (ms) | share of the gap |",
             "| --- | --- | --- | --- | --- |"]
    for family in det:
        diff = det[family] - fast[family]
        share = f"{diff / gap:.0%}" if gap > 0 else "-"
        lines.append(f"| {family} | {det[family]:.1f} | {fast[family]:.1f} | {diff:+.1f} | {share} |")
    lines.append(f"| **total (profiled)** | {sum(det.values()):.1f} | {sum(fast.values()):.1f} | {gap:+.1f} | |")
    return lines


__all__ = ["FAMILIES", "UNLINKED", "family_ranges", "family_times", "kernel_table", "kernel_times", "merge",
           "profile_step", "table", "torch"]
