#!/usr/bin/env python3
"""A probe on one GPU: how much of a train step at CREDIT's sizes is the host's launch work.

For each class it builds three steps of the same model as `benchmarks/step_at_size.py` does
(`--section`, `--models`): the fast step as the trainer runs it, and deterministic and fast
steps whose forward and backward replay one CUDA graph, captured once after two warm-up
passes on a side stream; clipping and the optimizer run eagerly after the replay, as
`update_parameters` runs them. It reports their median steps (interleaved), the graphed
deterministic step against the eager fast one, each step's peak GPU memory, and whether a
replay's gradients equal an eager forward and backward's bit for bit, from the same
parameters and power-iteration vectors (or why the capture failed). The trainer does not
capture graphs: this measures what doing so would give before it is built.

    python benchmarks/step_graphs.py --section benchmarks/configs/wxformer_1deg.yml \\
        [--models wxformer,crossformer] [--batch 1] [--steps 6] [--out FILE] [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # the benchmarks' own helpers
from determinism import report  # noqa: E402
from step_at_size import TWO_WARMUP, Mode, class_overrides, load_section, machine, sync  # noqa: E402


class GraphedMode(Mode):
    """A mode whose forward and backward replay one CUDA graph, captured once after warm-up on
    a side stream; gradient clipping and the optimizer run eagerly after the replay, as
    `update_parameters` runs them (the exact norm reads its bins on the host). A probe of what
    removing the host's launch work would give: the trainer does not capture graphs.

    `same_bits` says whether one replay's gradients equal an eager forward and backward's,
    bit for bit, from the same parameters and power-iteration vectors; `error` holds why the
    capture failed, when it did (the mode is then not timed)."""

    def __init__(self, overrides: list[str], mode: str, device: torch.device, batch: int) -> None:
        super().__init__(overrides, mode, device, batch)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.same_bits: bool | None = None
        self.error: str | None = None
        try:
            self.same_bits = self._capture()
        except Exception as exc:  # a probe: report what stopped the capture, measure the rest
            self.graph, self.error = None, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"

    def _finished_grads(self) -> list[torch.Tensor]:
        from credit.models.spectral_norm import finish_spectral_norm_gradients

        if self.deterministic:
            finish_spectral_norm_gradients(self.model)
        return [p.grad.detach().clone() for p in self.model.parameters() if p.grad is not None]

    def _capture(self) -> bool:
        live = self.model.state_dict()
        saved = {key: value.detach().clone() for key, value in live.items()}

        def restore() -> None:
            with torch.no_grad():
                for key, value in saved.items():
                    live[key].copy_(value)

        self.optimizer.zero_grad(set_to_none=True)
        self.forward_backward()  # compiles what is still to compile; the reference gradients
        eager = self._finished_grads()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as capture wants
            for _ in range(2):
                restore()
                self.optimizer.zero_grad(set_to_none=True)
                self.forward_backward()
        torch.cuda.current_stream().wait_stream(side)
        restore()
        self.optimizer.zero_grad(set_to_none=True)  # the graph allocates the gradients it writes
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.forward_backward()
        self.graph.replay()
        replayed = self._finished_grads()
        return len(eager) == len(replayed) and all(
            torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
            for a, b in zip(eager, replayed))

    def step(self) -> float:
        import credit.train.trainer as trainer_module

        sync(self.batch["state"].device)
        started = time.perf_counter()
        self.graph.replay()  # rewrites the gradients the capture allocated: no zero_grad
        norm = trainer_module.update_parameters(self.model, self.optimizer, None, deterministic=self.deterministic,
                                                data="none", grad_clip=self.cfg.trainer.grad_clip)
        float(norm)
        sync(self.batch["state"].device)
        self.step_index += 1
        return time.perf_counter() - started


def measure_graphs(overrides: list[str], device: torch.device, batch: int, steps: int) -> dict:
    """Eager fast against graphed deterministic and fast steps, interleaved; each graphed
    mode's peak is what a process building, capturing and stepping it alone holds."""
    built: dict[str, Mode] = {"fast": Mode(overrides, "fast", device, batch)}
    peaks: dict[str, float | None] = {"fast": built["fast"].peak_bytes()}
    probes: dict[str, GraphedMode] = {}
    for mode in ("deterministic", "fast"):
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        probe = GraphedMode(overrides, mode, device, batch)
        probes[mode] = probe
        if probe.graph is not None:
            probe.step()
            torch.cuda.synchronize(device)
            built[f"{mode} graph"] = probe
            peaks[f"{mode} graph"] = torch.cuda.max_memory_allocated(device) - base
    names = list(built)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(steps + TWO_WARMUP):
        for name in (names if i % 2 == 0 else names[::-1]):
            seconds = built[name].step()
            if i >= TWO_WARMUP:
                times[name].append(seconds)
    return {"times": times, "peaks": peaks,
            "probes": {m: {"same_bits": p.same_bits, "error": p.error} for m, p in probes.items()}}


def graph_rows(name: str, result: dict) -> list[str]:
    times = {k: statistics.median(v) for k, v in result["times"].items()}
    probes, peaks = result["probes"], result["peaks"]

    def ms(key: str) -> str:
        return f"{times[key] * 1e3:.1f}" if key in times else "n/a"

    def ratio(a: str, b: str) -> str:
        return f"{times[a] / times[b]:.2f}x" if a in times and b in times else "n/a"

    def gib(key: str) -> str:
        return f"{peaks[key] / 2**30:.2f}" if peaks.get(key) is not None else "n/a"

    def bits(mode: str) -> str:
        probe = probes[mode]
        if probe["error"]:
            return probe["error"]
        # fast mode's kernels (atomics in some backward passes) need not repeat their bits
        return "yes" if probe["same_bits"] else ("**no**" if mode == "deterministic" else "no")

    return [f"| {name} | {ms('fast')} | {ms('deterministic graph')} | {ms('fast graph')} | "
            f"{ratio('deterministic graph', 'fast')} | {ratio('deterministic graph', 'fast graph')} | "
            f"{gib('fast')} | {gib('deterministic graph')} | {gib('fast graph')} | {bits('deterministic')} | "
            f"{bits('fast')} |"]


GRAPH_HEADER = [
    "| class | fast step (ms) | deterministic, graphed (ms) | fast, graphed (ms) | det graphed / fast | "
    "det graphed / fast graphed | fast peak (GiB) | det graphed peak (GiB) | fast graphed peak (GiB) | "
    "deterministic: a replay's gradients equal eager ones | fast: the same (not promised) |",
    "|" + " --- |" * 11,
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--section", type=Path, required=True, help="a YAML file with a CREDIT model: section")
    parser.add_argument("--models", default="", help="classes to build at the section's sizes "
                        "(default: the section's own type)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args()
    section = load_section(args.section)
    if not torch.cuda.is_available():
        raise SystemExit("error: step_graphs.py captures CUDA graphs: no CUDA GPU is visible")
    device = torch.device("cuda")
    classes = [c for c in args.models.split(",") if c] or [None]
    table = list(GRAPH_HEADER)
    for model_class in classes:
        overrides = [*class_overrides(section, model_class), *args.overrides]
        result = measure_graphs(overrides, device, args.batch, args.steps)
        table += graph_rows(model_class or section.get("type", "?"), result)
        print(table[-1], flush=True)
        torch.cuda.empty_cache()
    lines = [
        f"# Graphed train steps at the size of {args.section} (batch {args.batch})",
        "",
        f"Machine: {machine(device)}; {args.steps} interleaved steps per mode after {TWO_WARMUP} warm-up steps; "
        "fp32. A graphed step replays one CUDA graph of the forward and backward (captured after two warm-up "
        "passes on a side stream), then clips and steps the optimizer eagerly. A probe: the trainer does not "
        "capture graphs. Peaks: what a process building, capturing and stepping that mode alone holds.",
        "",
        *table,
        "",
        f"Reproduce: `python benchmarks/step_graphs.py --section {args.section} "
        f"{'--models ' + args.models + ' ' if args.models else ''}--batch {args.batch} "
        f"--steps {args.steps}{''.join(' ' + o for o in args.overrides)}`",
    ]
    report(lines, args.out)


if __name__ == "__main__":
    main()
