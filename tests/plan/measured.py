"""A real training step's memory, measured on a rank of a real (gloo) run: what `credit plan`
estimates, taken from the allocator instead of a trace.

torch's CPU allocator reports every allocation and free to the profiler. The step's peak is
the most bytes allocated during it at once, above what the rank held before (gradients
freed first, as the step frees them). `credit plan` counts tensors, not the scratch space
kernels take for themselves: CPU convolutions' im2col columns, gloo's staging copies of
collective buffers (NCCL writes in place). An allocation freed before the operator that made
it returns is such scratch, and `tensor_peak` leaves it out; `peak` keeps it.
"""

from __future__ import annotations

import tempfile

import torch
from torch._C._profiler import _EventType
from torch.distributed.tensor import DTensor
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


def _local_bytes(tensors) -> int:
    return sum((t.to_local() if isinstance(t, DTensor) else t).numel() * t.element_size() for t in tensors)


def measure_step(overrides: list[str]) -> dict[str, int]:
    """Train one step, then measure the next on this rank (run with the launcher's ranks)."""
    from credit.config import compose_config
    from credit.parallel import build_runtime
    from credit.train.trainer import Trainer

    cfg = compose_config([*overrides, "data.num_workers=0", f"run_dir={tempfile.mkdtemp()}"])
    trainer = Trainer(cfg, build_runtime(cfg))
    trainer.setup()
    trainer.model.train()
    batches = iter(trainer.loader)
    trainer.train_step(batches)  # the optimizer state exists from here on
    trainer.optimizer.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        trainer.train_step(batches)
    peak, tensor_peak = step_peaks(prof.profiler.kineto_results.experimental_event_tree())
    params = list(trainer.model.parameters())
    state = [v for s in trainer.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return dict(peak=peak, tensor_peak=tensor_peak, params=_local_bytes(params),
                grads=_local_bytes(p.grad for p in params if p.grad is not None), optimizer=_local_bytes(state))
