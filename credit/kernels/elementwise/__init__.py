"""Deterministic mode's per-element passes on the CPU, one pass each: the AdamW update of
`credit.train.elementwise_adamw` and the exact sum of squares of `credit.parallel.exact_norm`.

A C++ extension (``csrc/cpu_elementwise.cpp``) built on first use like the CPU GEMM's
(`credit.kernels.gemm._cpu`: the same SIMD level, build lock and ninja), with
``-ffp-contract=off`` so each multiply and add is its own rounding in vector and scalar code
alike. Hand-written: torch's list-wide ops stream every tensor through memory once per
operation (a dozen passes for AdamW); a fused pass reads and writes each element once. The
callers keep torch's ops for other devices, or where the extension cannot be built.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import ModuleType

import torch

_SOURCE = Path(__file__).with_name("csrc") / "cpu_elementwise.cpp"
_lock = threading.Lock()
_state: dict[str, ModuleType | str] = {}


def load() -> ModuleType | None:
    """The extension for this CPU's SIMD level, built on first use; None when it cannot be."""
    from credit.kernels.gemm._build import build_environment, extension_name
    from credit.kernels.gemm._cpu import _ISA_FLAGS, default_isa

    isa = default_isa()
    with _lock:
        found = _state.get(isa)
        if found is not None:
            return found if isinstance(found, ModuleType) else None
        try:
            from torch.utils import cpp_extension

            name = extension_name(f"credit_det_elementwise_cpu_{isa}")
            build_dir = cpp_extension._get_build_directory(name, verbose=False)
            with build_environment(build_dir):
                module = cpp_extension.load(
                    name=name, sources=[str(_SOURCE)], build_directory=build_dir, verbose=False,
                    extra_cflags=["-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", *_ISA_FLAGS[isa]],
                    extra_ldflags=["-fopenmp"])
        except Exception as exc:  # compiler or ninja missing, build error: torch's ops instead
            _state[isa] = f"building the elementwise extension ({isa}) failed: {exc}"
            return None
        _state[isa] = module
        return module


def fused(*tensors: torch.Tensor) -> ModuleType | None:
    """The extension when every tensor is a plain contiguous float32 CPU tensor (not a
    DTensor, whose data lives on its local shard), else None."""
    from torch.distributed.tensor import DTensor

    if not all(not isinstance(t, DTensor) and t.device.type == "cpu" and t.dtype == torch.float32
               and t.is_contiguous() for t in tensors):
        return None
    return load()
