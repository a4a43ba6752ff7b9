"""Record every `torch.distributed` collective a rank makes, with its tensors' devices.

CI has no GPU, so a tensor that would sit on the host in a CUDA run cannot be told apart
by its device here (everything is CPU). What gives it away is how it was made: a factory
call (`torch.tensor`, `torch.zeros`, ...) without `device=` puts it on the host whatever
the run's device. The recorder tags such tensors, clears the tag when `.to(device)` places
one explicitly, and carries it through a device-less `.to(dtype)`. A collective that
receives a tagged tensor would hand NCCL a CPU tensor on a GPU run.

Covered: collectives called through the `torch.distributed` module (credit's own, FSDP2's
and DCP's). Not covered: DTensor's functional collectives (they run on the DTensor's own
device by construction).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

OPS = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
    "reduce_scatter_tensor", "broadcast", "all_to_all_single", "reduce", "gather", "scatter",
    "send", "recv", "batch_isend_irecv", "barrier", "broadcast_object_list",
    "all_gather_object", "gather_object", "scatter_object_list",
)
# not `isend`/`irecv`: P2POp checks their identity; their batches are recorded instead
FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "as_tensor")
_TAG = "_made_without_device"
_CREDIT = str(Path(__file__).resolve().parents[2] / "credit")


@dataclass(frozen=True)
class Call:
    op: str
    site: str  # "credit/<module>.py:<function>" or "torch" for torch's own calls
    backend: str
    devices: tuple[str, ...]
    host_made: bool  # a tensor made by a factory without device= reached the collective


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dist.P2POp):
        return [value.tensor]
    return []


def _site() -> str:
    """Who called the collective: a credit module and function, or torch itself."""
    caller = inspect.currentframe().f_back.f_back  # _site <- wrapper <- caller
    while caller is not None and caller.f_code.co_filename.endswith(("contextlib.py", "credit/compat.py")):
        caller = caller.f_back  # torch's decorators (no_grad, ...) and credit's torch shims sit in between
    path = str(Path(caller.f_code.co_filename).resolve()) if caller else ""
    if path.startswith(_CREDIT):
        return f"credit{path[len(_CREDIT):]}:{caller.f_code.co_name}"
    return "torch"


def _gives_device(args: tuple, kwargs: dict) -> bool:
    if kwargs.get("device") is not None:
        return True
    return bool(args) and isinstance(args[0], (str, torch.device, int, torch.Tensor))


class CollectiveRecorder:
    """Patch the collectives and factories of this process; `calls` lists what ran."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._saved: list[tuple[object, str, object]] = []

    def _patch(self, owner: object, name: str, replacement: object) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def install(self) -> CollectiveRecorder:
        for name in OPS:
            if hasattr(dist, name):
                self._patch(dist, name, self._recording(name, getattr(dist, name)))
        for name in FACTORIES:
            self._patch(torch, name, _tagging(getattr(torch, name)))
        original_to = torch.Tensor.to

        @functools.wraps(original_to)
        def to(tensor, *args, **kwargs):
            out = original_to(tensor, *args, **kwargs)
            if _gives_device(args, kwargs):
                if getattr(out, _TAG, False):
                    setattr(out, _TAG, False)  # placed explicitly (on CPU, `.to` returns itself)
            elif getattr(tensor, _TAG, False) and out is not tensor:
                setattr(out, _TAG, True)
            return out

        self._patch(torch.Tensor, "to", to)
        return self

    def uninstall(self) -> None:
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        self._saved.clear()

    def _recording(self, op: str, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            group = kwargs.get("group")
            if op == "batch_isend_irecv" and args and args[0]:
                group = args[0][0].group
            tensors = _tensors(list(args) + [v for k, v in kwargs.items() if k != "group"])
            self.calls.append(Call(
                op=op,
                site=_site(),
                backend=str(dist.get_backend(group)),
                devices=tuple(sorted({t.device.type for t in tensors})),
                host_made=any(getattr(t, _TAG, False) for t in tensors),
            ))
            return fn(*args, **kwargs)

        return wrapper


def _tagging(factory):
    @functools.wraps(factory)
    def make(*args, **kwargs):
        out = factory(*args, **kwargs)
        if kwargs.get("device") is None and isinstance(out, torch.Tensor):
            setattr(out, _TAG, True)
        return out

    return make
