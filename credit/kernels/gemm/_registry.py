"""Backend registry: names, availability per device, and strict selection.

``auto`` picks ``triton`` (tensor-core leaves) for CUDA tensors, ``cuda`` only where
triton cannot run, and ``cpu`` for CPU tensors. The ``cuda`` kernel keeps the contract with
plain IEEE FMA chains and no tensor cores: it is the slow one, kept for its bits (equal to
the cpu backend's, to check a GPU result on a CPU), never the first choice.  It never picks ``reference`` (plain ``torch.matmul``, which is not
batch-invariant) and nothing ever falls back silently: an unknown name or a
backend that cannot run on the tensors' device raises an error that lists what
is available there.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

BACKENDS: tuple[str, ...] = ("cpu", "triton", "cuda", "reference")
"""Every backend name; ``"auto"`` is accepted in addition."""

_AUTO_ORDER = {"cuda": ("triton", "cuda"), "cpu": ("cpu",)}

MMFn = Callable[[torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run on the tensors' device."""


def _reference_reason(device: torch.device) -> str | None:
    return None


def _cpu_reason(device: torch.device) -> str | None:
    if device.type != "cpu":
        return f"the cpu backend runs on CPU tensors only (got device {device})"
    from . import _cpu

    return _cpu.unavailable_reason()


def _triton_reason(device: torch.device) -> str | None:
    from . import _triton

    return _triton.unavailable_reason(device)


def _cuda_reason(device: torch.device) -> str | None:
    from . import _cuda

    return _cuda.unavailable_reason(device)


_REASONS = {
    "cpu": _cpu_reason,
    "triton": _triton_reason,
    "cuda": _cuda_reason,
    "reference": _reference_reason,
}


def _as_device(device: torch.device | str) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def unavailable_reason(name: str, device: torch.device | str) -> str | None:
    """Why backend ``name`` cannot run on ``device``; ``None`` if it can."""
    if name not in _REASONS:
        raise ValueError(f"unknown gemm backend {name!r}; known: {list(BACKENDS)}")
    return _REASONS[name](_as_device(device))


def available_backends(device: torch.device | str) -> list[str]:
    """Backends that can run on ``device`` (may build extensions on first call).

    ``reference`` is always listed; it is for comparisons only and is never
    chosen by ``auto``.
    """
    return [name for name in BACKENDS if unavailable_reason(name, device) is None]


_RESOLVED: dict[tuple[str, torch.device], str] = {}
"""Successful resolutions by (choice, device): every deterministic op resolves its backend,
and the availability checks behind a first answer (an extension load, a module search, a
device query) cost microseconds of host time a call, which add up on a launch-bound GPU
step. Failures are not kept, so a backend made available later is found then."""


def resolve(backend: str, device: torch.device | str) -> str:
    """Map a user's backend choice to a concrete backend for ``device``."""
    if isinstance(device, torch.device) and (device.type != "cuda" or device.index is not None):
        found = _RESOLVED.get((backend, device)) if isinstance(backend, str) else None
        if found is not None:
            return found
        name = _resolve(backend, device)
        _RESOLVED[(backend, device)] = name
        return name
    return _resolve(backend, device)


def _resolve(backend: str, device: torch.device | str) -> str:
    dev = _as_device(device)
    if not isinstance(backend, str) or backend not in (*BACKENDS, "auto"):
        raise ValueError(
            f"unknown gemm backend {backend!r}; choose one of {['auto', *BACKENDS]} "
            f"(available on {dev}: {available_backends(dev)})"
        )
    if backend == "auto":
        reasons = []
        for name in _AUTO_ORDER.get(dev.type, ()):
            why = unavailable_reason(name, dev)
            if why is None:
                return name
            reasons.append(f"{name}: {why}")
        raise BackendUnavailableError(
            f"no deterministic gemm backend for device {dev} "
            f"({'; '.join(reasons) or 'no backend targets this device type'}); "
            f"available: {available_backends(dev)}"
        )
    why = unavailable_reason(backend, dev)
    if why is not None:
        raise BackendUnavailableError(
            f"gemm backend {backend!r} is not available on {dev}: {why}; "
            f"available: {available_backends(dev)}"
        )
    return backend


def _reference_mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    # torch.matmul: vendor BLAS, NOT batch-invariant; for comparisons only.
    if out_dtype == a.dtype:
        return torch.matmul(a, b)
    return torch.matmul(a.to(out_dtype), b.to(out_dtype))


def kernel(name: str) -> MMFn:
    """The ``mm(a, b, out_dtype)`` implementation of a resolved backend."""
    if name == "cpu":
        from . import _cpu

        return _cpu.mm
    if name == "triton":
        from . import _triton

        return _triton.mm
    if name == "cuda":
        from . import _cuda

        return _cuda.mm
    if name == "reference":
        return _reference_mm
    raise ValueError(f"unknown gemm backend {name!r}; known: {list(BACKENDS)}")
