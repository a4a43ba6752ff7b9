"""Deterministic, batch-invariant GEMM (forward and backward).

Public surface::

    det_mm(a, b, *, backend="auto", out_dtype=None)        # a (M, K) @ b (K, N)
    det_linear(x, weight, bias=None, *, backend="auto")    # x (*, K), weight (N, K)
    DetLinear(in_features, out_features, bias=True, ..., backend="auto")
    available_backends(device) -> list[str]

Contract (every backend except ``reference``):

* Inputs float32, bfloat16 or float16 (both operands the same dtype and on
  the same device); products accumulate in fp32 (no TF32, no reduced
  precision accumulation) and the output is rounded once to the input dtype.
* No split-K or stream-K.  Tile sizes are fixed constants; the kernel and its
  K order depend only on (K, N, dtype, device), never on M.
* K order: leaves of ``LEAF = 32`` consecutive K elements, each accumulated
  sequentially from zero; leaves are combined by the fixed binary tree
  ``T(n) = T(ceil(n/2)) + T(floor(n/2))`` over the ``n = ceil(K/32)`` leaves.
  Hence when K splits into 2, 4 or 8 equal parts that are multiples of 32,
  the full result equals the pairwise (tree) sum of the parts' results,
  bitwise (fp32 output).
* A row's result is bitwise independent of the other rows (batch size,
  chunking, padding) and of N (a column computed in a narrower N is equal);
  on the CPU also of the thread count.
* Backward: ``dA = dC·Bᵀ`` (tree over N), ``dB = Aᵀ·dC`` (tree over M, the
  rows in order, 32-row leaves), by the same kernels.  ``dA`` rows are batch
  invariant; ``dB`` (``dW``) is a fixed function of the rows and their order.

Backends: ``cpu`` (C++ extension built on first use), ``triton`` (CUDA GPUs,
or CPU tensors under ``TRITON_INTERPRET=1``), ``cuda`` (CUDA C++ extension,
sm80+), ``reference`` (``torch.matmul``; NOT deterministic, comparisons only).
``auto`` picks cuda then triton for CUDA tensors and cpu for CPU tensors, and
never ``reference``.  Unknown or unavailable backends raise; there is no
silent fallback.  Bits are reproducible per backend and device type, not
across backends (leaf-internal order differs on tensor cores).
"""

from ._module import DetLinear
from ._ops import SUPPORTED_DTYPES, det_linear, det_mm
from ._registry import BACKENDS, BackendUnavailableError, available_backends
from ._tree import LEAF, left_leaves

__all__ = [
    "BACKENDS",
    "LEAF",
    "left_leaves",
    "SUPPORTED_DTYPES",
    "BackendUnavailableError",
    "DetLinear",
    "available_backends",
    "det_linear",
    "det_mm",
]
