"""Backend-agnostic checks of the det_mm contract.

Each ``check_*`` raises ``AssertionError`` on violation.  The same functions
run in-process for the cpu backend, in a ``TRITON_INTERPRET=1`` subprocess for
the triton backend, and on CUDA machines for the GPU backends.
"""

from __future__ import annotations

import torch

from credit.kernels.gemm import LEAF, det_linear, det_mm
from credit.kernels.gemm._tree import tree_sum

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
U32 = 2.0**-24  # unit roundoff of fp32
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def rand(*shape: int, dtype: torch.dtype, device: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)


def same(x: torch.Tensor, y: torch.Tensor, what: str) -> None:
    """Bitwise equality (bit patterns, so -0.0 vs +0.0 or NaN payloads count)."""
    assert x.shape == y.shape and x.dtype == y.dtype, f"{what}: {x.shape}/{x.dtype} vs {y.shape}/{y.dtype}"
    bits = {4: torch.int32, 2: torch.int16}[x.element_size()]
    xb, yb = x.contiguous().view(bits), y.contiguous().view(bits)
    n_bad = int((xb != yb).sum())
    assert n_bad == 0, f"{what}: {n_bad} of {x.numel()} elements differ bitwise"


def error_bound(abs_a: torch.Tensor, abs_b: torch.Tensor, k: int, out_dtype: torch.dtype,
                extra_terms: int = 0) -> torch.Tensor:
    """Rigorous forward-error bound of the contract's summation, elementwise.

    A leaf sums at most LEAF products with one rounding each (FMA chain; any
    other order of <= LEAF terms also has depth <= LEAF), the tree adds
    ceil(log2(n_leaves)) more roundings on each path, ``extra_terms`` more
    additions (e.g. bias) follow, all in fp32:  |err| <= gamma_m * sum|a||b|
    with gamma_m = m u / (1 - m u), u = 2^-24 (Higham, Accuracy and Stability
    of Numerical Algorithms, eq. 3.4-3.5).  The final rounding to the output
    dtype adds u_out * |c| <= u_out * (1 + gamma_m) * sum|a||b|.
    """
    n_leaves = max(1, -(-k // LEAF))
    depth = (n_leaves - 1).bit_length()
    m = min(k, LEAF) + depth + extra_terms
    gamma = m * U32 / (1 - m * U32)
    u_out = UNIT_ROUNDOFF[out_dtype] if out_dtype != torch.float32 else 0.0
    scale = abs_a.double() @ abs_b.double()
    return (gamma + u_out * (1 + gamma)) * scale


def check_accuracy(backend: str, device: str, dtype: torch.dtype, m: int, k: int, n: int) -> None:
    a = rand(m, k, dtype=dtype, device=device, seed=1)
    b = rand(k, n, dtype=dtype, device=device, seed=2)
    c = det_mm(a, b, backend=backend)
    assert c.dtype == dtype and c.shape == (m, n) and c.device == a.device
    exact = a.double() @ b.double()
    err = (c.double() - exact).abs()
    bound = error_bound(a.abs(), b.abs(), k, dtype)
    worst = float((err - bound).max())
    assert worst <= 0, f"error exceeds the bound by {worst} ({dtype}, {m}x{k}x{n})"


def check_backward(backend: str, device: str, dtype: torch.dtype, m: int, k: int, n: int) -> None:
    a = rand(m, k, dtype=dtype, device=device, seed=3).requires_grad_()
    b = rand(k, n, dtype=dtype, device=device, seed=4).requires_grad_()
    g = rand(m, n, dtype=dtype, device=device, seed=5)
    det_mm(a, b, backend=backend).backward(g)
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    (a64 @ b64).backward(g.double())
    # dA = g @ b^T reduces over n; dB = a^T @ g reduces over m.
    bound_a = error_bound(g.abs(), b.detach().abs().t(), n, dtype)
    bound_b = error_bound(a.detach().abs().t(), g.abs(), m, dtype)
    for name, got, ref, bnd in (("dA", a.grad, a64.grad, bound_a), ("dB", b.grad, b64.grad, bound_b)):
        assert got.dtype == dtype and got.shape == ref.shape, name
        worst = float(((got.double() - ref).abs() - bnd).max())
        assert worst <= 0, f"{name} error exceeds the bound by {worst} ({dtype})"


def check_row_invariance(backend: str, device: str, dtype: torch.dtype, k: int, n: int,
                         batch_sizes: tuple[int, ...]) -> None:
    """Row r's result at M=1 equals the same row inside larger batches."""
    big = max(batch_sizes)
    a = rand(big, k, dtype=dtype, device=device, seed=6)
    b = rand(k, n, dtype=dtype, device=device, seed=7)
    full = {mb: det_mm(a[:mb], b, backend=backend) for mb in batch_sizes}
    for r in sorted({0, min(batch_sizes) - 1}):
        single = det_mm(a[r : r + 1], b, backend=backend)
        for mb, c in full.items():
            same(single[0], c[r], f"row {r} alone vs inside M={mb}")


def check_chunking(backend: str, device: str, dtype: torch.dtype, k: int, n: int,
                   chunks: tuple[int, ...]) -> None:
    """Computing rows in chunks (e.g. 100 + 156) equals computing them at once."""
    a = rand(sum(chunks), k, dtype=dtype, device=device, seed=8)
    b = rand(k, n, dtype=dtype, device=device, seed=9)
    whole = det_mm(a, b, backend=backend)
    parts = torch.cat([det_mm(p, b, backend=backend) for p in a.split(list(chunks))])
    same(parts, whole, f"chunks {chunks} vs whole")


def check_padding(backend: str, device: str, dtype: torch.dtype, m: int, k: int, n: int) -> None:
    """Extra random rows before and after do not change the original rows."""
    a = rand(m, k, dtype=dtype, device=device, seed=10)
    b = rand(k, n, dtype=dtype, device=device, seed=11)
    pad_top = rand(3, k, dtype=dtype, device=device, seed=12)
    pad_bot = rand(37, k, dtype=dtype, device=device, seed=13)
    base = det_mm(a, b, backend=backend)
    padded = det_mm(torch.cat([pad_top, a, pad_bot]), b, backend=backend)
    same(padded[3 : 3 + m], base, "rows inside a padded batch")


def check_n_invariance(backend: str, device: str, dtype: torch.dtype, m: int, k: int, n: int) -> None:
    """A column computed within a narrower (or offset) N is identical."""
    a = rand(m, k, dtype=dtype, device=device, seed=14)
    b = rand(k, n, dtype=dtype, device=device, seed=15)
    full = det_mm(a, b, backend=backend)
    for lo, hi in ((0, 1), (0, n // 2), (n // 3, n - 1), (n - 5, n)):
        same(det_mm(a, b[:, lo:hi], backend=backend), full[:, lo:hi], f"columns {lo}:{hi}")


def check_k_split(backend: str, device: str, dtype: torch.dtype, m: int, k: int, n: int,
                  parts: int) -> None:
    """With K cut into ``parts`` (2, 4, 8) equal leaf-aligned pieces, the fp32
    results of the pieces added pairwise equal the full fp32 result bitwise."""
    assert k % (parts * LEAF) == 0, "test shape must split into leaf-aligned parts"
    a = rand(m, k, dtype=dtype, device=device, seed=16)
    b = rand(k, n, dtype=dtype, device=device, seed=17)
    full = det_mm(a, b, backend=backend, out_dtype=torch.float32)
    step = k // parts
    pieces = [det_mm(a[:, i : i + step], b[i : i + step], backend=backend, out_dtype=torch.float32)
              for i in range(0, k, step)]
    while len(pieces) > 1:
        pieces = [pieces[i] + pieces[i + 1] for i in range(0, len(pieces), 2)]
    same(pieces[0], full, f"K={k} split into {parts}")


def check_tree_order(backend: str, device: str, dtype: torch.dtype, m: int, k: int, n: int) -> None:
    """The fp32 result is the tree T(n) over the kernel's own one-leaf results: each
    32-wide slice of K computed alone, then added as `tree_sum` does (any leaf count,
    the last leaf short)."""
    a = rand(m, k, dtype=dtype, device=device, seed=21)
    b = rand(k, n, dtype=dtype, device=device, seed=22)
    full = det_mm(a, b, backend=backend, out_dtype=torch.float32)
    leaves = [det_mm(a[:, i : i + LEAF], b[i : i + LEAF], backend=backend, out_dtype=torch.float32)
              for i in range(0, k, LEAF)]
    same(tree_sum(leaves), full, f"K={k} as the tree over {len(leaves)} leaves")


def check_grad_row_invariance(backend: str, device: str, dtype: torch.dtype, m: int, k: int,
                              n: int) -> None:
    """dA for a row is the same alone and inside a batch (det_mm and det_linear)."""
    a = rand(m, k, dtype=dtype, device=device, seed=18)
    b = rand(k, n, dtype=dtype, device=device, seed=19)
    g = rand(m, n, dtype=dtype, device=device, seed=20)
    w = b.t().contiguous()

    def grads(rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        x = a[rows].clone().requires_grad_()
        det_mm(x, b, backend=backend).backward(g[rows])
        x2 = a[rows].clone().requires_grad_()
        det_linear(x2, w, backend=backend).backward(g[rows])
        return x.grad, x2.grad

    full_mm, full_lin = grads(slice(0, m))
    for r in (0, m - 1):
        one_mm, one_lin = grads(slice(r, r + 1))
        same(one_mm[0], full_mm[r], f"det_mm dA row {r}")
        same(one_lin[0], full_lin[r], f"det_linear dx row {r}")


def check_weight_grad_order(backend: str, device: str, dtype: torch.dtype, k: int, n: int) -> None:
    """dW follows the row tree: zero-gradient rows padded inside the last 32-row
    leaf leave it unchanged, and two equal 32-aligned half batches add up to it."""
    x = rand(128, k, dtype=dtype, device=device, seed=21)
    w = rand(n, k, dtype=dtype, device=device, seed=22).requires_grad_()
    bias = rand(n, dtype=dtype, device=device, seed=23).requires_grad_()
    g = rand(128, n, dtype=dtype, device=device, seed=24)

    def wgrad(xs: torch.Tensor, gs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w.grad = bias.grad = None
        det_linear(xs, w, bias, backend=backend).backward(gs)
        return w.grad.clone(), bias.grad.clone()

    dw100, db100 = wgrad(x[:100], g[:100])
    g_pad = torch.cat([g[:100], torch.zeros_like(g[100:])])
    dw_pad, db_pad = wgrad(x, g_pad)
    same(dw_pad, dw100, "dW with zero-gradient padding rows")
    same(db_pad, db100, "dbias with zero-gradient padding rows")
    if dtype == torch.float32:
        dw, db = wgrad(x, g)
        dw1, db1 = wgrad(x[:64], g[:64])
        dw2, db2 = wgrad(x[64:], g[64:])
        same(dw1 + dw2, dw, "dW of two half batches added")
        same(db1 + db2, db, "dbias of two half batches added")


def check_run_to_run(backend: str, device: str, dtype: torch.dtype, m: int, k: int, n: int) -> None:
    a = rand(m, k, dtype=dtype, device=device, seed=25).requires_grad_()
    b = rand(k, n, dtype=dtype, device=device, seed=26).requires_grad_()
    g = rand(m, n, dtype=dtype, device=device, seed=27)
    outs = []
    for _ in range(2):
        a.grad = b.grad = None
        c = det_mm(a, b, backend=backend)
        c.backward(g)
        outs.append((c.detach(), a.grad.clone(), b.grad.clone()))
    for name, x, y in zip(("C", "dA", "dB"), outs[0], outs[1]):
        same(x, y, f"run-to-run {name}")


def check_whole_k(backend: str, device: str, dtype: torch.dtype, m: int, k: int, n: int) -> None:
    """`whole_k=True` (one chain over K, no tree): rows alone, in a slice and after padding rows
    give the batch's bits, a narrower N the same columns, run to run the same bits, within the
    bound of one K-long fp32 chain; the cpu backend gives its tree's bits."""
    a = rand(m, k, dtype=dtype, device=device, seed=96)
    b = rand(k, n, dtype=dtype, device=device, seed=97)
    full = det_mm(a, b, backend=backend, whole_k=True)
    same(det_mm(a, b, backend=backend, whole_k=True), full, "run to run")
    for lo, hi in ((0, 1), (7, 8), (3, m - 10), (m - 1, m)):
        same(det_mm(a[lo:hi], b, backend=backend, whole_k=True), full[lo:hi], f"rows {lo}:{hi}")
    padded = torch.cat([rand(5, k, dtype=dtype, device=device, seed=98), a])
    same(det_mm(padded, b, backend=backend, whole_k=True)[5:], full, "rows after 5 padding rows")
    for lo, hi in ((0, 1), (0, n // 2), (n // 3, n)):
        same(det_mm(a, b[:, lo:hi].contiguous(), backend=backend, whole_k=True), full[:, lo:hi],
             f"columns {lo}:{hi}")
    exact = a.double() @ b.double()
    gamma = k * U32 / (1 - k * U32)  # one chain of k fp32 additions (Higham 3.4)
    u_out = UNIT_ROUNDOFF[dtype] if dtype != torch.float32 else 0.0
    bound = (gamma + u_out * (1 + gamma)) * (a.double().abs() @ b.double().abs())
    worst = float(((full.double() - exact).abs() - bound).max())
    assert worst <= 0, f"{dtype}: the chain's error exceeds its bound by {worst}"
    if backend == "cpu":
        same(full, det_mm(a, b, backend="cpu"), "cpu ignores whole_k")
