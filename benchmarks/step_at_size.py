#!/usr/bin/env python3
"""Train steps at CREDIT's real sizes: deterministic against fast, and the fast step's model
FLOP utilisation, on one device, with no dataset.

A CREDIT `model:` section (a file such as `benchmarks/configs/wxformer_1deg.yml`) gives the
model and its grid; `--models` builds the same sizes as each of CREDIT's classes (the keys the
class does not take are dropped). Each mode's model, AdamW and loss are built as `credit train`
builds them, and a step is the trainer's own arithmetic (`credit.train.step`: forward, loss,
backward, gradient clipping, optimizer) on a random batch of the sample's shapes, held on the
device: the data pipeline is left out, so the figures are the model's.

Reported per class: the median step of each mode from interleaved samples (ABBA after two
warm-up steps each), their ratio, the peak GPU memory of each mode, and for the fast step its
FLOPs (torch's FlopCounterMode over one forward and backward: matrix products, convolutions
and attention), its achieved TFLOP/s and that over the GPU's dense bf16 tensor peak (MFU).

    python benchmarks/step_at_size.py --section benchmarks/configs/wxformer_1deg.yml \\
        [--models nextgen_wxformer,wxformer,crossformer] [--modes deterministic,fast] \\
        [--device cuda] [--batch 1] [--steps 6] [--out FILE] [KEY=VALUE ...]

Trailing KEY=VALUE overrides apply after the section (a smaller grid for a CPU dry run).
On a GPU the peak of a mode is what one process training only that mode would hold: its own
parameters, optimizer state and batch, plus the most its step allocates above that.

Goals (issue): deterministic / fast <= 1.3x and peak memory <= 1.2x at the 1-degree size.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))  # the benchmarks' own helpers (machine, op_families)
from determinism import report  # noqa: E402
from machine import cpu_name  # noqa: E402

# Dense tensor-core peaks of the datasheets, TFLOP/s (bf16; TF32 is half of it on these parts)
BF16_PEAK = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "GH200": 989.0}
TWO_WARMUP = 2


def bf16_peak(name: str) -> float | None:
    """The dense bf16 peak of the GPU named `name` (TFLOP/s), None when not in the table."""
    for key in sorted(BF16_PEAK, key=len, reverse=True):
        if key in name:
            return BF16_PEAK[key]
    return None


def class_overrides(section: dict, model_class: str | None) -> list[str]:
    """`model=...` overrides that build `section`, or the same sizes as `model_class`."""
    from credit.interop.checkpoint_import import model_overrides
    from credit.models.credit.config import DEFAULTS, resolve_credit_model

    kind, values = resolve_credit_model(section, warn=False)
    if model_class and model_class != kind:
        if model_class not in DEFAULTS:
            raise SystemExit(f"error: --models {model_class!r} is not one of {sorted(DEFAULTS)}")
        values = {k: v for k, v in values.items() if k in DEFAULTS[model_class]}
        kind = model_class
        if "padding_conf" not in DEFAULTS[kind]:  # it pads nothing: the nearest grid it tiles
            tile = tiling_multiple(values)
            for key in ("image_height", "image_width"):
                values[key] = -(-int(values[key]) // tile) * tile
    return model_overrides(kind, values)


def tiling_multiple(values: dict) -> int:
    """The multiple a grid must be for every stage's windows to tile it without padding."""
    from credit.models.credit.config import credit_spec

    spec = credit_spec(values)
    stride, multiple = 1, 1
    for step, window, local in zip(spec.cross_embed_strides, spec.global_window_size, spec.local_window_size):
        stride *= step
        multiple = math.lcm(multiple, stride * math.lcm(int(window), int(local)))
    return multiple


class Mode:
    """One mode's model, optimizer, loss and batch, stepped as the trainer steps them."""

    def __init__(self, overrides: list[str], mode: str, device: torch.device, batch: int) -> None:
        from credit.config import compose_config
        from credit.models import build_model
        from credit.parallel.seeding import seed_for_init
        from credit.plan.shapes import sample_shapes
        from credit.train.losses import WeightedLoss
        from credit.train.setup import build_optimizer

        self.cfg = compose_config([*overrides, f"model.gemm={mode}", f"trainer.batch_size={batch}",
                                   f"trainer.device={device.type}"])
        self.deterministic = mode == "deterministic"
        self.batch_size = batch
        shapes = sample_shapes(self.cfg)
        seed_for_init(self.cfg.trainer.seed)
        self.model = build_model(self.cfg.model, **shapes.layout()).to(device)
        self.model.train()
        self.parameters = sum(p.numel() for p in self.model.parameters())
        self.optimizer = build_optimizer(self.model, self.cfg.trainer.optimizer, self.deterministic)
        channels = shapes.state_channels + shapes.diagnostic
        lat = torch.cos(torch.linspace(-1.5, 1.5, shapes.grid[0]))  # any positive weights
        self.loss_fn = WeightedLoss(lat / lat.mean(), torch.ones(channels)).to(device)
        generator = torch.Generator().manual_seed(0)
        self.batch = {key: torch.randn(shape, generator=generator).to(device)
                      for key, shape in shapes.batch(batch).items()}
        self.step_index = 0
        self.grid = shapes.grid

    def forward_backward(self) -> None:
        from credit.models import advance_spectral_norm
        from credit.models.dropout import dropout_step
        from credit.train.step import backward_micro_batch

        advance_spectral_norm(self.model)
        with dropout_step(self.cfg.trainer.seed, self.step_index, 0, self.batch_size):
            backward_micro_batch(self.model, self.batch, self.loss_fn, accum=1, deterministic=self.deterministic,
                                 step_samples=self.batch_size, forecast_steps=self.cfg.trainer.loss.forecast_steps)

    def step(self) -> float:
        """One optimizer step; its seconds, the device synchronised at both ends."""
        # through the trainer module's name, which op_families' profile ranges wrap
        import credit.train.trainer as trainer_module

        sync(self.batch["state"].device)
        started = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        self.forward_backward()
        norm = trainer_module.update_parameters(self.model, self.optimizer, None, deterministic=self.deterministic, data="none",
                                 grad_clip=self.cfg.trainer.grad_clip)
        float(norm)  # the trainer reads the norm every step
        sync(self.batch["state"].device)
        self.step_index += 1
        return time.perf_counter() - started

    def held_bytes(self) -> int:
        tensors = [*self.model.parameters(), *self.model.buffers(), *self.batch.values(),
                   *(v for s in self.optimizer.state.values() for v in s.values() if torch.is_tensor(v))]
        return sum(t.numel() * t.element_size() for t in tensors)

    def peak_bytes(self) -> int | None:
        """What a process training only this mode peaks at (GPU only, None elsewhere)."""
        device = self.batch["state"].device
        if device.type != "cuda":
            return None
        self.optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        self.step()
        return self.held_bytes() + torch.cuda.max_memory_allocated(device) - base

    def profiled(self) -> dict[str, dict]:
        """One step under torch.profiler: milliseconds by operation family (op_families.py),
        "host" (self CPU time) and, on a GPU, "device" (kernel time) and "kernels" ((ms,
        launches) per kernel name, unattributed)."""
        from torch.profiler import ProfilerActivity, profile

        from op_families import family_ranges, family_times, kernel_times

        cuda = self.batch["state"].device.type == "cuda"
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
        with family_ranges(self), profile(activities=activities) as prof:
            self.step()
        events = prof.events()
        if not cuda:
            return {"host": family_times(events)}
        return {"host": family_times(events), "device": family_times(events, "device"), "kernels": kernel_times(events)}

    def flops(self) -> int:
        """FLOPs of one forward and backward, counted by torch's FlopCounterMode."""
        from torch.utils.flop_counter import FlopCounterMode

        self.optimizer.zero_grad(set_to_none=True)
        counter = FlopCounterMode(display=False)
        with counter:
            self.forward_backward()
        self.optimizer.zero_grad(set_to_none=True)
        return counter.get_total_flops()


def load_section(path: Path) -> dict:
    """The `model:` section of the YAML file `path`, or exit with one line naming it."""
    try:
        return yaml.safe_load(path.read_text())["model"]
    except (OSError, yaml.YAMLError, TypeError, KeyError):
        raise SystemExit(f"error: --section {path}: not a readable YAML file with a model: section")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(overrides: list[str], modes: list[str], device: torch.device, batch: int, steps: int,
            profiled: int = 0) -> dict:
    """Interleaved step times, peaks, (fast) FLOPs and `profiled` steps' families of one class."""
    built = {mode: Mode(overrides, mode, device, batch) for mode in modes}
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for i in range(steps + TWO_WARMUP):
        order = modes if i % 2 == 0 else modes[::-1]  # ABBA: neither mode always runs first
        for mode in order:
            seconds = built[mode].step()
            if i >= TWO_WARMUP:
                times[mode].append(seconds)
    result = {"times": times, "peak": {m: built[m].peak_bytes() for m in modes},
              "parameters": built[modes[0]].parameters, "grid": built[modes[0]].grid}
    if "fast" in built:
        result["flops"] = built["fast"].flops()
    result["families"] = {mode: [] for mode in modes}
    for i in range(profiled):
        for mode in (modes if i % 2 == 0 else modes[::-1]):
            result["families"][mode].append(built[mode].profiled())
    del built
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, {os.cpu_count()} CPU cores"
    return f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def rows(name: str, result: dict, modes: list[str], peak: float | None) -> list[str]:
    med = {m: statistics.median(result["times"][m]) for m in modes}
    cells = [name, f"{result['grid'][0]}x{result['grid'][1]}", f"{result['parameters'] / 1e6:.1f}"]
    cells += [f"{med[m] * 1e3:.1f}" for m in modes]
    if len(modes) == 2:
        pairs = [a / b for a, b in zip(*(result["times"][m] for m in modes))]
        cells.append(f"{med[modes[0]] / med[modes[1]]:.2f}x ({min(pairs):.2f}-{max(pairs):.2f})")
    peaks = result["peak"]
    cells += ["n/a" if peaks[m] is None else f"{peaks[m] / 2**30:.2f}" for m in modes]
    if len(modes) == 2 and None not in peaks.values():
        cells.append(f"{peaks[modes[0]] / peaks[modes[1]]:.2f}x")
    elif len(modes) == 2:
        cells.append("n/a")
    if "flops" in result:
        tflops = result["flops"] / med["fast"] / 1e12
        cells += [f"{result['flops'] / 1e12:.3g}", f"{tflops:.3g}",
                  "n/a" if peak is None else f"{tflops / peak:.1%}"]
    return ["| " + " | ".join(cells) + " |"]


def family_tables(name: str, families: dict[str, list], modes: list[str], profiled: int) -> list[str]:
    """Markdown tables of where each mode's step goes, by operation family and clock."""
    from op_families import merge, table

    clocks = {"host": "self CPU time", "device": "GPU kernel time"}
    lines = []
    for clock in [c for c in clocks if c in families[modes[0]][0]]:
        runs = {m: merge([run[clock] for run in families[m]]) for m in modes}
        lines += ["", f"## {name}: median of {profiled} profiled steps per mode, {clocks[clock]} by operation "
                      f"family", ""]
        if len(modes) == 2:
            lines += table(runs["deterministic"], runs["fast"])
        else:  # one mode: its times alone
            only = runs[modes[0]]
            lines += [f"| family | {modes[0]} (ms) |", "| --- | --- |",
                      *(f"| {family} | {ms:.1f} |" for family, ms in only.items()),
                      f"| **total (profiled)** | {sum(only.values()):.1f} |"]
    if len(modes) == 2 and "kernels" in families[modes[0]][0]:
        from op_families import kernel_table

        lines += ["", f"## {name}: GPU kernels of the first profiled step per mode, by time (no attribution)", ""]
        lines += kernel_table(families["deterministic"][0]["kernels"], families["fast"][0]["kernels"])
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--section", type=Path, required=True, help="a YAML file with a CREDIT model: section")
    parser.add_argument("--models", default="", help="classes to build at the section's sizes "
                        "(default: the section's own type)")
    parser.add_argument("--modes", default="deterministic,fast", help="deterministic,fast | fast | deterministic")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="N profiled steps per mode after the timed ones: time by operation family")
    parser.add_argument("--out", type=Path)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in ("deterministic", "fast") for m in modes) or len(set(modes)) != len(modes):
        raise SystemExit(f"error: --modes {args.modes!r}: deterministic,fast, fast or deterministic")
    section = load_section(args.section)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no CUDA GPU is visible")
    peak = bf16_peak(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    classes = [c for c in args.models.split(",") if c] or [None]

    header = ["class", "grid", "params (M)", *(f"{m} step (ms)" for m in modes)]
    if len(modes) == 2:
        header.append("det / fast (per-pair range)")
    header += [f"{m} peak (GiB)" for m in modes]
    if len(modes) == 2:
        header.append("det / fast peak")
    if "fast" in modes:
        header += ["fast TFLOP per step", "fast TFLOP/s", "MFU (dense bf16 peak)"]
    table = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    profiles = []
    for model_class in classes:
        overrides = [*class_overrides(section, model_class), *args.overrides]
        result = measure(overrides, modes, device, args.batch, args.steps, args.profile)
        name = model_class or section.get("type", "?")
        table += rows(name, result, modes, peak)
        print(table[-1], flush=True)
        if args.profile:
            profiles += family_tables(name, result["families"], modes, args.profile)
    lines = [
        f"# Train steps at the size of {args.section} (batch {args.batch})",
        "",
        f"Machine: {machine(device)}; {args.steps} interleaved steps per mode after {TWO_WARMUP} warm-up steps; "
        f"fp32 throughout (one process: no mixed precision); a class that pads nothing runs on the nearest grid its windows tile. MFU: the fast step's counted FLOPs per second over "
        f"the dense bf16 tensor peak ({'not in the table for this device' if peak is None else f'{peak:.0f} TFLOP/s'}).",
        "",
        *table,
        "",
        f"Reproduce: `python benchmarks/step_at_size.py --section {args.section} "
        f"{'--models ' + args.models + ' ' if args.models else ''}--modes {args.modes} --device {args.device} "
        f"--batch {args.batch} --steps {args.steps}{f' --profile {args.profile}' if args.profile else ''}"
        f"{''.join(' ' + o for o in args.overrides)}`",
        *profiles,
    ]
    report(lines, args.out)


if __name__ == "__main__":
    main()
