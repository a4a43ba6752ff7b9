#!/usr/bin/env python3
"""`credit plan`'s estimate of a step's memory beside the same step measured on real gloo ranks.

A real training step's memory, measured on a rank of a real (gloo) run: what `credit plan`
estimates, taken from the allocator instead of a trace.

torch's CPU allocator reports every allocation and free to the profiler. The step's peak is
the most bytes allocated during it at once, above what the rank held before (gradients
freed first, as the step frees them). `credit plan` counts tensors, not the scratch space
kernels take for themselves: CPU convolutions' im2col columns, gloo's staging copies of
collective buffers (NCCL writes in place). An allocation freed before the operator that made
it returns is such scratch, and `tensor_peak` leaves it out; `peak` keeps it.

    python benchmarks/plan_accuracy.py [--grid 16x32] [KEY=VALUE ...]

generates a dataset of the grid, then for one process, tp2 with sequence parallelism, dp2 x tp2
(FSDP2 and DDP) and dp2 (FSDP2) on CREDIT's wxformer (widths 16-128, batch 4 per replica)
prints the measured step memory of the last rank (with and without the kernels' scratch), the
estimate, and the parameter, gradient and optimizer bytes of both. tests/plan holds the first
three within 10%.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile


def _walk(events):
    for event in events:
        yield event
        yield from _walk(event.children)


def _outer_operator(event):
    """The outermost operator (aten, c10d, gloo) the allocation happened in, or None."""
    found, parent = None, event.parent
    while parent is not None:
        if parent.name.startswith(("aten::", "c10d::", "gloo:")):
            found = parent
        parent = parent.parent
    return found


def step_peaks(events) -> tuple[int, int]:
    """(peak, tensor_peak) bytes above the start of the profile (module docstring)."""
    allocations = sorted((e for e in _walk(events) if e.tag == _EventType.Allocation),
                         key=lambda e: e.start_time_ns)
    made: dict[int, object] = {}  # ptr -> the allocation event not yet freed
    scratch: set[int] = set()  # ids of allocations freed inside the operator that made them
    for event in allocations:
        fields = event.extra_fields
        if fields.alloc_size > 0:
            made[fields.ptr] = event
        elif fields.ptr in made:
            start = made.pop(fields.ptr)
            operator = _outer_operator(start)
            if operator is not None and event.start_time_ns <= operator.end_time_ns:
                scratch.add(id(start))
                scratch.add(id(event))
    now = peak = tensor_now = tensor_peak = 0
    for event in allocations:
        now += event.extra_fields.alloc_size
        peak = max(peak, now)
        if id(event) not in scratch:
            tensor_now += event.extra_fields.alloc_size
            tensor_peak = max(tensor_peak, tensor_now)
    return peak, tensor_peak


MEASURED_STEPS = 3


def measure_step(overrides: list[str]) -> dict[str, int]:
    """Train one step, then measure the next `MEASURED_STEPS` on this rank (run with the
    launcher's ranks) and keep the one of least tensor memory: a step's tensors are the same
    each time, but when a collective's buffers are freed depends on gloo's threads, and a late
    free only adds to the peak (in 4 runs of dp2 x tp2 one step's ranks ranged over 10%)."""
    from credit.config import compose_config
    from credit.parallel import build_runtime
    from credit.plan.trace import shard_bytes
    from credit.train.trainer import Trainer

    cfg = compose_config([*overrides, "data.num_workers=0", f"run_dir={tempfile.mkdtemp()}"])
    trainer = Trainer(cfg, build_runtime(cfg))
    trainer.setup()
    trainer.model.train()
    batches = iter(trainer.loader)
    trainer.train_step(batches)  # the optimizer state exists from here on
    steps = []
    for _ in range(MEASURED_STEPS):
        trainer.optimizer.zero_grad(set_to_none=True)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            trainer.train_step(batches)
        steps.append(step_peaks(prof.profiler.kineto_results.experimental_event_tree()))
    peak, tensor_peak = min(steps, key=lambda peaks: peaks[1])
    return dict(peak=peak, tensor_peak=tensor_peak, **shard_bytes(trainer.model, trainer.optimizer))


CROSSFORMER = ["model=wxformer", "model.padding_conf.activate=true", "model.padding_conf.pad_lat=[8,8]",
               "model.dim=[16,32,64,128]", "trainer.batch_size=4"]
LAYOUTS = {
    "one process": (1, []),
    "tp2 + sequence parallel": (2, ["trainer.parallelism.tensor=2", "trainer.parallelism.sequence_parallel=true"]),
    "dp2 x tp2 fsdp2": (4, ["trainer.parallelism.tensor=2", "trainer.parallelism.data=fsdp2",
                            "trainer.batch_size=2"]),
    "dp2 x tp2 ddp": (4, ["trainer.parallelism.tensor=2", "trainer.parallelism.data=ddp", "trainer.batch_size=2"]),
    "dp2 fsdp2": (2, ["trainer.parallelism.data=fsdp2", "trainer.batch_size=2"]),
}
DATA = ["data.generate_if_missing=false", "data.levels=[500,850]", "data.train_period=[2000-01-01,2000-01-12]",
        "data.valid_period=[2001-01-01,2001-01-12]", "data.valid_samples=2", "trainer.progress_bar=false"]


def _rank_worker(rank: int, world: int, port: int, overrides: list[str], out: str) -> None:
    import json
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        measured = measure_step(overrides)
        if rank == world - 1:
            Path(out).write_text(json.dumps(measured))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main() -> None:
    import argparse
    import json
    import os
    import socket

    import torch.multiprocessing as mp

    from credit.config import compose_config
    from credit.data import generate_dataset
    from credit.plan.shapes import sample_shapes
    from credit.plan.trace import trace_step
    from machine import cpu_name

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--grid", default="16x32")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args()
    grid = tuple(int(n) for n in args.grid.split("x"))
    mib = 2**20
    lines = [f"# credit plan against measured steps ({args.grid}, CREDIT's wxformer 16-128)", "",
             f"Machine: {cpu_name()}, {os.cpu_count()} cores, gloo, OMP_NUM_THREADS=1 per rank; the last rank; "
             "MiB. measured: the allocator's peak above the step's start, the step of least tensor memory of steps 2-4 (tensors: without the kernels' "
             "scratch); plan: the traced step.", "",
             "| layout | measured | tensors | plan | plan / tensors | params measured / plan | grads | optimizer |",
             "| --- | ---: | ---: | ---: | ---: | --- | --- | --- |"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        generate_dataset(root, grid=grid, years=[2000, 2001], levels=[500, 850], train_years=[2000],
                         days_per_year=12, progress=False)
        for name, (world, layout) in LAYOUTS.items():
            overrides = [f"data.root={root}", *DATA, *CROSSFORMER, *layout, *args.overrides]
            if world == 1:
                measured = measure_step(overrides)
            else:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
                out = f"{tmp}/{world}.json"
                mp.start_processes(_rank_worker, args=(world, port, overrides, out), nprocs=world,
                                   start_method="spawn")
                measured = json.loads(Path(out).read_text())
            cfg = compose_config(overrides)
            plan = trace_step(cfg, sample_shapes(cfg, grid), world)
            pairs = " | ".join(f"{measured[k] / mib:.2f} / {getattr(plan, k) / mib:.2f}"
                               for k in ("params", "grads", "optimizer"))
            lines.append(f"| {name} | {measured['peak'] / mib:.2f} | {measured['tensor_peak'] / mib:.2f} "
                         f"| {plan.activation / mib:.2f} | {plan.activation / measured['tensor_peak']:.3f} | {pairs} |")
    lines += ["", "Reproduce: `python benchmarks/plan_accuracy.py --grid " + args.grid
              + "".join(" " + o for o in args.overrides) + "`"]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
