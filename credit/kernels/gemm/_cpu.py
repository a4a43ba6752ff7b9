"""CPU backend: a C++ extension compiled on first use and cached.

The extension (engine ``csrc/cpu_gemm_engine.cpp`` and ``csrc/cpu_gemm_tile.inc``, the row
tree's sums ``csrc/cpu_row_sums.cpp``, bindings ``csrc/cpu_gemm.cpp``; operands are offset
tables, see ``csrc/cpu_gemm_kernel.h``) is built with ``torch.utils.cpp_extension``
for the SIMD level torch reports for this CPU (AVX-512, AVX2+FMA, or portable
scalar code).  The build directory is keyed by that level, so a shared cache
never hands an AVX-512 binary to an AVX2 machine.  All three code paths use
single-rounding FMA, so they produce the same bits.

How the reduction order is pinned: each output element is a sequential FMA
chain over each 32-element K leaf, and leaves are combined by the fixed tree in
``_tree.py``.  Threads (``at::parallel_for``, i.e. ``torch.set_num_threads``)
split the output tiles, never K; edge tiles are zero-padded and go through the
same micro-kernel.  No BLAS library is called (hand-written: no library offers a GEMM
with a caller-fixed reduction order).
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from pathlib import Path
from types import ModuleType

import torch

from ._build import build_environment, extension_name
from ._tree import merge_schedule, num_leaves, schedule_tensor

_CSRC = Path(__file__).with_name("csrc")
_SOURCES = [_CSRC / "cpu_gemm.cpp", _CSRC / "cpu_gemm_engine.cpp", _CSRC / "cpu_row_sums.cpp",
            _CSRC / "cpu_layer_norm.cpp", _CSRC / "cpu_group_norm.cpp"]
_ISA_FLAGS = {
    "avx512": ["-mavx512f", "-mavx2", "-mfma", "-mf16c"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "scalar": [],
}
ISA_ENV = "CREDIT_GEMM_CPU_ISA"
"""Environment variable forcing the SIMD level (``avx512``, ``avx2``, ``scalar``)."""

_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}
_errors: dict[str, str] = {}


def default_isa() -> str:
    """SIMD level to build for: ``$CREDIT_GEMM_CPU_ISA`` or what torch detects."""
    forced = os.environ.get(ISA_ENV)
    if forced:
        if forced not in _ISA_FLAGS:
            raise ValueError(f"{ISA_ENV}={forced!r}; allowed: {sorted(_ISA_FLAGS)}")
        return forced
    return _detected_isa()


@functools.cache
def _detected_isa() -> str:
    """What torch detects, once (this sits on every deterministic op's path)."""
    cap = torch.backends.cpu.get_cpu_capability().upper()
    if cap.startswith("AVX512"):
        return "avx512"
    if cap.startswith("AVX2"):
        return "avx2"
    return "scalar"


def _included_files_flag() -> str:
    """A define naming the hash of the header and included files: torch rebuilds a cached
    extension when its sources or flags change, and would miss a change to these alone."""
    digest = hashlib.sha256()
    for path in sorted(_CSRC.glob("cpu_*")):
        if path.suffix in (".h", ".inc"):
            digest.update(path.name.encode() + path.read_bytes())
    return f"-DCREDIT_GEMM_INCLUDES={digest.hexdigest()[:16]}"


def load(isa: str | None = None) -> ModuleType:
    """Build (first call) or load the extension for ``isa``; raise on failure."""
    isa = isa or default_isa()
    mod = _modules.get(isa)  # built already: no lock (every deterministic op comes here)
    if mod is not None:
        return mod
    with _lock:
        if isa in _modules:
            return _modules[isa]
        if isa in _errors:
            raise RuntimeError(_errors[isa])
        try:
            from torch.utils import cpp_extension

            # no -std: torch adds the C++ standard its own headers need (c++17 in 2.11 and 2.13, c++20 in 2.15)
            flags = ["-O3", "-fopenmp", "-ffp-contract=off", *_ISA_FLAGS[isa], _included_files_flag()]
            name = extension_name(f"credit_det_gemm_cpu_{isa}")
            build_dir = cpp_extension._get_build_directory(name, verbose=False)
            with build_environment(build_dir):
                mod = cpp_extension.load(
                    name=name,
                    sources=[str(p) for p in _SOURCES],
                    extra_cflags=flags,
                    extra_ldflags=["-fopenmp"],
                    build_directory=build_dir,
                    verbose=False,
                )
        except Exception as exc:  # compiler missing, ninja missing, build error
            _errors[isa] = f"building the cpu extension ({isa}) failed: {exc}"
            raise RuntimeError(_errors[isa]) from exc
        _modules[isa] = mod
        return mod


def unavailable_reason() -> str | None:
    """``None`` if the extension loads, else why it does not."""
    try:
        load()
    except RuntimeError as exc:
        return str(exc)
    return None


def mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype,
       bias: torch.Tensor | None = None, k_groups: int = 1) -> torch.Tensor:
    """``a @ b`` on the CPU with the fixed K tree; inputs already validated. ``bias`` (N,) is
    added in fp32 to the finished sums before the one rounding to ``out_dtype``. With
    ``k_groups`` > 1, K is reduced as that many equal groups each padded to whole leaves:
    ``pad_row_groups(a.t(), k_groups).t() @ pad_row_groups(b, k_groups)``'s bits, without the
    padded copies or the padding's products."""
    mod = load()
    M, K = a.shape
    N = b.shape[1]
    out = torch.empty((M, N), dtype=out_dtype, device=a.device)
    n = k_groups * num_leaves(K // k_groups)
    if bias is not None:
        bias = bias.to(torch.float32).contiguous()
    mod.det_mm(a, b, schedule_tensor(n, a.device), merge_schedule(n)[1], out, bias, k_groups)
    return out


def colsum(g: torch.Tensor, groups: int = 1, times: torch.Tensor | None = None) -> torch.Tensor:
    """Sum over the rows of fp32 ``g (M, N)`` (of ``g * times`` when given, each product
    rounded once) with the row tree, its rows as ``groups`` equal groups each padded to whole
    leaves (``ones(1, M') @ pad_row_groups(g, groups)``'s bits)."""
    mod = load()
    if g.shape[1] > 1 and g.stride(1) != 1:
        g = g.contiguous()
    if times is not None and times.shape[1] > 1 and times.stride(1) != 1:
        times = times.contiguous()
    out = torch.empty(g.shape[1], dtype=torch.float32, device=g.device)
    groups = max(groups, 1)
    n = groups * num_leaves(g.shape[0] // groups)
    mod.det_colsum(g, times, groups, schedule_tensor(n, g.device), merge_schedule(n)[1], out)
    return out


def channel_sums(g: torch.Tensor, times: torch.Tensor | None = None) -> torch.Tensor:
    """Per-channel sums of fp32 NCHW ``g`` (of ``g * times`` when given, each product rounded
    once) with the row tree of its channels-last rows, each sample's positions padded to
    whole leaves: ``colsum(g.permute(0, 2, 3, 1).reshape(-1, C), groups=B)``'s bits, without
    the channels-last copy."""
    mod = load()
    b, c = g.shape[:2]
    flat = g.contiguous().view(b, c, -1)
    if times is not None:
        times = times.contiguous().view(flat.shape)
    out = torch.empty(c, dtype=torch.float32, device=g.device)
    n = b * num_leaves(flat.shape[2])
    mod.det_channel_sums(flat, times, schedule_tensor(n, g.device), merge_schedule(n)[1], out)
    return out


def affine(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``x * weight + bias``'s bits (the product rounded, then the sum) for fp32 rows ``x``
    (M, N) and ``weight``, ``bias`` (N,), in one pass."""
    mod = load()
    x = x.contiguous()
    y = torch.empty_like(x)
    mod.det_affine(x, weight.contiguous(), bias.contiguous(), y)
    return y


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
               eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, normed, rstd): layer norm of fp32 rows ``x`` (M, D) in one fixed order per row
    (csrc/cpu_layer_norm.cpp), ``y = normed * weight + bias`` with `affine`'s roundings."""
    mod = load()
    x = x.contiguous()
    y, normed = torch.empty_like(x), torch.empty_like(x)
    rstd = torch.empty(x.shape[0], dtype=torch.float32)
    mod.det_layer_norm(x, weight.contiguous(), bias.contiguous(), eps, y, normed, rstd)
    return y, normed, rstd


def layer_norm_input_grad(g_normed: torch.Tensor, normed: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """`layer_norm`'s input gradient from its normed values' gradient (overwritten)."""
    load().det_layer_norm_input_grad(g_normed, normed, rstd)
    return g_normed


def layer_norm_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, mean, rstd): layer norm of wide fp32 rows ``x`` (M, D), each row's sums in a fixed
    lane order (csrc/cpu_layer_norm.cpp), ``y = ((x - mean) * rstd) * weight + bias``."""
    mod = load()
    x = x.contiguous()
    y = torch.empty_like(x)
    mean = torch.empty(x.shape[0], dtype=torch.float32)
    rstd = torch.empty(x.shape[0], dtype=torch.float32)
    mod.det_layer_norm_rows(x, weight.contiguous(), bias.contiguous(), eps, y, mean, rstd)
    return y, mean, rstd


def layer_norm_rows_grads(g: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                          weight: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias) of `layer_norm_rows` in one pass; the affine gradients are
    ``affine_grads``' sums of ``g`` and of ``g`` times the normed rows (rows in ``groups``)."""
    mod = load()
    g = g.contiguous()
    gx = torch.empty_like(g)
    gw = torch.empty(g.shape[1], dtype=torch.float32)
    gb = torch.empty(g.shape[1], dtype=torch.float32)
    n = groups * num_leaves(g.shape[0] // groups)
    mod.det_layer_norm_rows_grads(g, x, mean, rstd, weight.contiguous(), groups, schedule_tensor(n, g.device),
                                  merge_schedule(n)[1], gx, gw, gb)
    return gx, gw, gb


def group_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, groups: int,
               eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, mean, rstd): group norm of fp32 NCHW ``x`` with its per-channel affine, each
    sample's group summed in a fixed lane order (csrc/cpu_group_norm.cpp)."""
    x = x.contiguous()
    y = torch.empty_like(x)
    mean = torch.empty(x.shape[0] * groups, dtype=torch.float32)
    rstd = torch.empty(x.shape[0] * groups, dtype=torch.float32)
    flat = (x.shape[0], x.shape[1], -1)
    load().det_group_norm(x.view(flat), weight.contiguous(), bias.contiguous(), groups, eps, y.view(flat), mean, rstd)
    return y, mean, rstd


def group_norm_grads(g: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                     weight: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias) of `group_norm` in one pass; the affine gradients per channel:
    each sample's sum of ``g`` times the normed values and of ``g`` (lane order), then the
    tree over the samples."""
    g = g.contiguous()
    gx = torch.empty_like(g)
    gw = torch.empty(g.shape[1], dtype=torch.float32)
    gb = torch.empty(g.shape[1], dtype=torch.float32)
    flat = (g.shape[0], g.shape[1], -1)
    n = g.shape[0]
    load().det_group_norm_grads(g.view(flat), x.view(flat), mean, rstd, weight.contiguous(), groups,
                                schedule_tensor(n, g.device), merge_schedule(n)[1], gx.view(flat), gw, gb)
    return gx, gw, gb


def affine_grads(g: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                 groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(g * weight, colsum(g, groups, times=x), colsum(g, groups)) of fp32 rows ``g``, ``x``
    (M, N) and ``weight`` (N,), in one pass, with those three results' bits."""
    mod = load()
    g, x = g.contiguous(), x.contiguous()
    gx = torch.empty_like(g)
    gw = torch.empty(g.shape[1], dtype=torch.float32)
    gb = torch.empty(g.shape[1], dtype=torch.float32)
    n = groups * num_leaves(g.shape[0] // groups)
    mod.det_affine_grads(g, x, weight.contiguous(), groups, schedule_tensor(n, g.device),
                         merge_schedule(n)[1], gx, gw, gb)
    return gx, gw, gb


def mm_gather(
    a: torch.Tensor, arow: torch.Tensor, acol: torch.Tensor,
    b: torch.Tensor, brow: torch.Tensor, bcol: torch.Tensor,
    out: torch.Tensor, orow: torch.Tensor, ocol: torch.Tensor,
    bias: torch.Tensor | None = None, bias_on_rows: bool = False,
) -> torch.Tensor:
    """``out[orow[i] + ocol[j]] = sum_k a[arow[i] + acol[k]] * b[brow[k] + bcol[j]]`` with the
    fixed K tree, over flat contiguous ``a``, ``b`` and ``out`` (a ``-1`` entry in ``acol``,
    ``brow`` or ``bcol`` reads as zero): the GEMM over operands that are not matrices in
    memory (per-sample padded row trees, implicit im2col). ``bias`` (fp32, per output column,
    or per row when ``bias_on_rows``) is added to the fp32 sums before the one rounding.
    Fills and returns ``out``."""
    mod = load()
    n = num_leaves(acol.numel())
    if n == 0:
        raise ValueError("mm_gather: K must be positive")
    if bias is not None:
        bias = bias.to(torch.float32).contiguous()
    mod.det_mm_gather(a, arow, acol, b, brow, bcol, out, orow, ocol, schedule_tensor(n, a.device),
                      merge_schedule(n)[1], bias, bias_on_rows)
    return out


def fold(cols: torch.Tensor, size: tuple[int, int], kernel: tuple[int, int],
         padding: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int],
         out: torch.Tensor | None = None) -> torch.Tensor:
    """``F.fold(cols, size, ...)``'s bits for fp32 ``cols (B, C*kh*kw, L)`` (each pixel's
    contributions added in col2im's order from zero), in loops that vectorise; written into
    ``out`` (contiguous (B, C, *size)) when given."""
    mod = load()
    channels = cols.shape[1] // (kernel[0] * kernel[1])
    if out is None:
        out = torch.empty((cols.shape[0], channels, *size), dtype=torch.float32)
    mod.det_fold(cols.contiguous(), out, *kernel, *padding, *stride, *dilation)
    return out
