"""CUDA and GPU-Triton backends.

Compile-only checks run wherever nvcc / a C++ compiler exists.  Execution
tests need a CUDA GPU (sm80+) and are skipped otherwise, with the reason.
"""

import shutil
import subprocess
import sysconfig

import pytest
import torch

import gemm_checks as C
from credit.kernels.gemm import det_mm
from credit.kernels.gemm._cuda import BINDING_SOURCE, KERNEL_SOURCE, NVCC_FLAGS

NVCC = shutil.which("nvcc")
CXX = shutil.which("g++") or shutil.which("c++")
HAS_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU with compute capability 8.0+")


@pytest.mark.skipif(NVCC is None, reason="nvcc not found on PATH")
def test_nvcc_compiles_kernel_for_sm80_and_sm90(tmp_path):
    obj = tmp_path / "cuda_gemm.o"
    cmd = [NVCC, "-c", str(KERNEL_SOURCE), "-o", str(obj), *NVCC_FLAGS, "-Xptxas", "-v",
           "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert obj.stat().st_size > 0
    # ptxas reports every kernel it assembles, per target architecture.
    for arch in ("sm_80", "sm_90"):
        assert f"for '{arch}'" in proc.stderr and "det_mm_kernel" in proc.stderr, proc.stderr


@pytest.mark.skipif(CXX is None, reason="no C++ compiler found")
def test_binding_compiles_against_torch_headers():
    from torch.utils.cpp_extension import include_paths

    incs = [f"-I{p}" for p in (*include_paths(), sysconfig.get_paths()["include"])]
    cmd = [CXX, "-fsyntax-only", "-std=c++17", "-DTORCH_EXTENSION_NAME=credit_det_gemm_cuda",
           *incs, str(BINDING_SOURCE)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]


GPU_CHECKS = {
    "accuracy": lambda be, dt: C.check_accuracy(be, "cuda", dt, 333, 96, 80),
    "accuracy_big": lambda be, dt: C.check_accuracy(be, "cuda", dt, 1024, 4096, 512),
    "backward": lambda be, dt: C.check_backward(be, "cuda", dt, 333, 96, 80),
    "row_invariance": lambda be, dt: C.check_row_invariance(be, "cuda", dt, 200, 80, (1, 64, 512)),
    "chunking": lambda be, dt: C.check_chunking(be, "cuda", dt, 96, 80, (100, 156)),
    "padding": lambda be, dt: C.check_padding(be, "cuda", dt, 333, 96, 80),
    "n_invariance": lambda be, dt: C.check_n_invariance(be, "cuda", dt, 37, 130, 150),
    "k_split_2": lambda be, dt: C.check_k_split(be, "cuda", dt, 19, 768, 70, 2),
    "k_split_8": lambda be, dt: C.check_k_split(be, "cuda", dt, 19, 1024, 70, 8),
    "grad_rows": lambda be, dt: C.check_grad_row_invariance(be, "cuda", dt, 70, 96, 80),
    "weight_grad": lambda be, dt: C.check_weight_grad_order(be, "cuda", dt, 48, 40),
    "run_to_run": lambda be, dt: C.check_run_to_run(be, "cuda", dt, 333, 96, 80),
}


@needs_gpu
@pytest.mark.parametrize("dtype", list(C.DTYPES.values()), ids=list(C.DTYPES))
@pytest.mark.parametrize("check", list(GPU_CHECKS))
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_contract(backend, check, dtype):
    GPU_CHECKS[check](backend, dtype)


@needs_gpu
def test_auto_prefers_cuda():
    from credit.kernels.gemm._registry import resolve

    assert resolve("auto", "cuda") == "cuda"


@needs_gpu
@pytest.mark.parametrize("dtype", list(C.DTYPES.values()), ids=list(C.DTYPES))
def test_cuda_matches_cpu_bitwise(dtype):
    """Both follow the contract with IEEE FMA chains, so their bits agree."""
    a = C.rand(100, 300, dtype=dtype, device="cpu", seed=70)
    b = C.rand(300, 90, dtype=dtype, device="cpu", seed=71)
    C.same(det_mm(a.cuda(), b.cuda(), backend="cuda").cpu(), det_mm(a, b, backend="cpu"),
           "cuda vs cpu")


@needs_gpu
def test_device_mismatch_cpu_and_cuda():
    with pytest.raises(ValueError, match="same device"):
        det_mm(torch.ones(4, 8), torch.ones(8, 5, device="cuda"))


TRITON_SIGNATURE = {
    "merges_ptr": "*i32", "scratch_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
    "n_leaves": "i32", "n_tiles": "i32", "tiles_n": "i32", "depth": "i32", "s_am": "i32",
    "s_ak": "i32", "s_bk": "i32", "s_bn": "i32", "s_cm": "i32", "s_cn": "i32",
    "BM": "constexpr", "BN": "constexpr", "LEAF": "constexpr", "INTERPRET": "constexpr",
}


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_triton_kernel_compiles_for_sm80_and_sm90(dtype):
    """Ahead-of-time compile of the GPU (non-interpreted) kernel to cubin."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from credit.kernels.gemm import _triton_kernel as tk

    if type(tk.det_mm_kernel).__name__ == "InterpretedFunction":
        pytest.skip("TRITON_INTERPRET=1 is set in this process")
    sig = {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": f"*{dtype}", **TRITON_SIGNATURE}
    consts = {"BM": tk.BLOCK_M, "BN": tk.BLOCK_N, "LEAF": 32, "INTERPRET": False}
    src = ASTSource(fn=tk.det_mm_kernel, signature=sig, constexprs=consts)
    for cc in (80, 90):
        kernel = triton.compile(src, target=GPUTarget("cuda", cc, 32),
                                options={"num_warps": tk.NUM_WARPS, "enable_fp_fusion": False})
        assert kernel.asm.get("cubin"), f"no cubin for sm_{cc}"
        assert f".target sm_{cc}" in kernel.asm["ptx"]
