"""CUDA backend: ``csrc/cuda_gemm.cu`` + ``csrc/cuda_binding.cpp``, built on
first use with ``torch.utils.cpp_extension`` for the visible GPU (sm80+).

The kernel follows the contract with explicit single-rounding FMAs and adds
(``--fmad=false`` keeps the compiler from fusing anything else), so its bits
match the cpu backend's.  ``cpp_extension`` picks the ``-gencode`` targets
(``TORCH_CUDA_ARCH_LIST`` or the visible GPUs); none are added here.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import ModuleType

import torch

from ._build import build_environment, extension_name
from ._tree import num_leaves, schedule_tensor

CSRC = Path(__file__).with_name("csrc")
KERNEL_SOURCE = CSRC / "cuda_gemm.cu"
BINDING_SOURCE = CSRC / "cuda_binding.cpp"
NVCC_FLAGS = ["-O3", "--fmad=false"]
"""nvcc flags (also used by the compile-only test); no -std: torch adds the C++ standard its
headers need (c++17 in 2.11 and 2.13, c++20 in 2.15), and the kernel source compiles under both."""

_lock = threading.Lock()
_module: ModuleType | None = None
_error: str | None = None


def load() -> ModuleType:
    """Build (first call) or load the CUDA extension; raise on failure."""
    global _module, _error
    with _lock:
        if _module is not None:
            return _module
        if _error is not None:
            raise RuntimeError(_error)
        try:
            from torch.utils import cpp_extension

            name = extension_name("credit_det_gemm_cuda")
            build_dir = cpp_extension._get_build_directory(name, verbose=False)
            with build_environment(build_dir):
                _module = cpp_extension.load(
                    name=name,
                    sources=[str(BINDING_SOURCE), str(KERNEL_SOURCE)],
                    extra_cflags=["-O3"],
                    extra_cuda_cflags=NVCC_FLAGS,
                    build_directory=build_dir,
                    verbose=False,
                )
        except Exception as exc:
            _error = f"building the cuda extension failed: {exc}"
            raise RuntimeError(_error) from exc
        return _module


def unavailable_reason(device: torch.device) -> str | None:
    """``None`` if the cuda backend can run on ``device``, else why not."""
    if device.type != "cuda":
        return f"the cuda backend runs on CUDA tensors only (got device {device})"
    if torch.version.cuda is None:
        return "this torch build has no CUDA support"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return f"needs compute capability 8.0+, device has {major}.{minor}"
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None:
        return "the CUDA toolkit (nvcc) was not found; set CUDA_HOME"
    try:
        load()
    except RuntimeError as exc:
        return str(exc)
    return None


def mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``a @ b`` with the CUDA kernel; inputs already validated."""
    mod = load()
    M, K = a.shape
    out = torch.empty((M, b.shape[1]), dtype=out_dtype, device=a.device)
    with torch.cuda.device(a.device):
        stream = torch.cuda.current_stream(a.device).cuda_stream
        mod.det_mm(a, b, schedule_tensor(num_leaves(K), a.device), out, stream)
    return out
