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
    # c++20: what torch >= 2.15's headers need, and torch 2.11's compile under it too
    cmd = [CXX, "-fsyntax-only", "-std=c++20", "-DTORCH_EXTENSION_NAME=credit_det_gemm_cuda",
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
    "tree_order": lambda be, dt: C.check_tree_order(be, "cuda", dt, 70, 23 * 32 - 7, 90),
    # 300 leaves: taller than the Triton kernel's register levels (split on the host)
    "tree_order_tall": lambda be, dt: C.check_tree_order(be, "cuda", dt, 70, 300 * 32, 90),
    # one chain over K (triton; the cuda backend keeps its tree): K past one 64 step, padded
    "whole_k": lambda be, dt: C.check_whole_k(be, "cuda", dt, 333, 1000, 300),
}


@needs_gpu
@pytest.mark.parametrize("dtype", list(C.DTYPES.values()), ids=list(C.DTYPES))
@pytest.mark.parametrize("check", list(GPU_CHECKS))
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_contract(backend, check, dtype):
    GPU_CHECKS[check](backend, dtype)


@needs_gpu
def test_auto_picks_the_tensor_core_kernel():
    from credit.kernels.gemm._registry import resolve

    assert resolve("auto", "cuda") == "triton"


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
    "M": "i32", "N": "i32", "K": "i32", "n_leaves": "i32", "s_am": "i32", "s_ak": "constexpr",
    "s_bk": "i32", "s_bn": "constexpr", "s_cm": "i32", "s_cn": "constexpr", "s_cz": "i32",
    "SPLIT": "constexpr", "DEPTH": "constexpr", "EVEN_K": "constexpr", "BM": "constexpr",
    "BN": "constexpr", "LEAF": "constexpr", "GROUP": "constexpr", "STAGES": "constexpr",
    "INTERPRET": "constexpr",
}
# what a launch on contiguous, 16-aligned operands specializes: unit strides, aligned rest
ALIGNED = ("a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "s_am", "s_bk", "s_cm", "s_cz")


def _ptxas_report(ptx: str, cc: int, tmp_path) -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    path = tmp_path / f"kernel_sm{cc}.ptx"
    path.write_text(ptx)
    arch = f"sm_{cc}a" if cc >= 90 else f"sm_{cc}"
    proc = subprocess.run([get_ptxas(cc).path, "-v", f"--gpu-name={arch}", str(path), "-o",
                           str(tmp_path / "kernel.cubin")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_triton_kernel_compiles_for_sm80_and_sm90(dtype, tmp_path):
    """Ahead-of-time compile of the GPU (non-interpreted) kernel, as a launch on aligned
    operands specializes it: tensor-core leaves for bf16/fp16, a software-pipelined K loop
    (cp.async), and the tallest tree and subtree a program takes (`max_depth`) held in
    registers with no spills; a short K with a padded last leaf compiles too."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from credit.kernels.gemm import _triton_kernel as tk
    if type(tk.det_mm_kernel).__name__ == "InterpretedFunction":
        pytest.skip("TRITON_INTERPRET=1 is set in this process")
    torch_name = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype]
    bm, bn, warps, stages = tk.TILES[torch_name]
    fn = tk.det_mm_kernel
    sig = {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": f"*{dtype}", **TRITON_SIGNATURE}
    for cc in (80, 90):
        whole, subtree = (tk.max_depth(torch_name, cc // 10, split) for split in (False, True))
        # (DEPTH, K a whole number of leaves, SPLIT): the tallest tree one launch holds,
        # a short K with a padded last leaf, and the tallest subtree of a launch split in 8
        for depth, even_k, split in ((whole, True, 0), (2, False, 0), (subtree, True, 3)):
            aligned = [name for name in ALIGNED if even_k or name != "K"]
            attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
            consts = {"s_ak": 1, "s_bn": 1, "s_cn": 1, "SPLIT": split, "DEPTH": depth,
                      "EVEN_K": even_k, "BM": bm, "BN": bn, "LEAF": 32, "GROUP": tk.GROUP_M,
                      "STAGES": stages, "INTERPRET": False}
            k = f"depth {depth}, split {split}, even K {even_k}"
            kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                                    target=GPUTarget("cuda", cc, 32),
                                    options={"num_warps": warps, "num_stages": stages,
                                             "enable_fp_fusion": False})
            ptx = kernel.asm["ptx"]
            assert kernel.asm.get("cubin"), f"no cubin for sm_{cc}"
            assert f".target sm_{cc}" in ptx
            assert "cp.async" in ptx, f"sm_{cc} {k}: the K loop is not pipelined"
            if dtype != "fp32":
                instruction = "wgmma.mma_async" if cc >= 90 else "mma.sync"
                assert instruction in ptx, f"sm_{cc}: no {instruction} in the {dtype} kernel"
            report = _ptxas_report(ptx, cc, tmp_path)
            assert "Used" in report and "registers" in report, report
            if depth in (whole, subtree) and even_k:  # the register budget: no spills
                assert "0 bytes spill stores" in report, f"sm_{cc} {k}: {report}"


CHAIN_SIGNATURE = {
    "M": "i32", "N": "i32", "K": "i32", "s_am": "i32", "s_ak": "constexpr", "s_bk": "i32",
    "s_bn": "constexpr", "s_cm": "i32", "s_cn": "constexpr", "BM": "constexpr", "BN": "constexpr",
    "BK": "constexpr", "GROUP": "constexpr", "STAGES": "constexpr", "INTERPRET": "constexpr",
}


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_triton_chain_kernel_compiles_for_sm80_and_sm90(dtype, tmp_path):
    """The one-chain kernel (`whole_k`), compiled ahead of time as an aligned launch
    specializes it: tensor-core MMAs for bf16/fp16, a pipelined K loop, no register spills."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from credit.kernels.gemm import _triton_kernel as tk
    if type(tk.det_chain_kernel).__name__ == "InterpretedFunction":
        pytest.skip("TRITON_INTERPRET=1 is set in this process")
    torch_name = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype]
    bm, bn, bk, warps, stages = tk.CHAIN_TILES[torch_name]
    fn = tk.det_chain_kernel
    sig = {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": f"*{dtype}", **CHAIN_SIGNATURE}
    aligned = ("a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "s_am", "s_bk", "s_cm")
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    consts = {"s_ak": 1, "s_bn": 1, "s_cn": 1, "BM": bm, "BN": bn, "BK": bk, "GROUP": tk.GROUP_M,
              "STAGES": stages, "INTERPRET": False}
    for cc in (80, 90):
        kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                                target=GPUTarget("cuda", cc, 32),
                                options={"num_warps": warps, "num_stages": stages,
                                         "enable_fp_fusion": False})
        ptx = kernel.asm["ptx"]
        assert f".target sm_{cc}" in ptx and "cp.async" in ptx, f"sm_{cc}: the K loop is not pipelined"
        if dtype != "fp32":
            instruction = "wgmma.mma_async" if cc >= 90 else "mma.sync"
            assert instruction in ptx, f"sm_{cc}: no {instruction} in the {dtype} chain kernel"
        report = _ptxas_report(ptx, cc, tmp_path)
        assert "0 bytes spill stores" in report, f"sm_{cc}: {report}"
