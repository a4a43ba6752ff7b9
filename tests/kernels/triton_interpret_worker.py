"""Runs the contract checks on the triton backend under Triton's interpreter.

Launched by test_gemm_triton_interpret.py in a subprocess so TRITON_INTERPRET
never leaks into other tests.  Prints one JSON object: check name -> "ok" or
the failure text.
"""

import json
import os
import sys
import traceback

if __name__ == "__main__":
    # Before triton is imported anywhere (the package imports it lazily).
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import gemm_checks as C  # noqa: E402
from credit.kernels.gemm import available_backends, det_mm  # noqa: E402

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
B, D = "triton", "cpu"


def registry() -> None:
    backends = available_backends("cpu")
    assert backends == ["cpu", "triton", "reference"], backends
    a = C.rand(70, 100, dtype=F32, device=D, seed=90)
    b = C.rand(100, 40, dtype=F32, device=D, seed=91)
    assert det_mm(a, b).dtype == F32  # auto still picks cpu on CPU tensors
    torch.testing.assert_close(det_mm(a, b, backend="triton"), det_mm(a, b, backend="cpu"))


def tall_tree() -> None:
    """A tree taller than the kernel's register levels is split at its top on the host:
    with one level allowed, K = 11 leaves gives the same bits as one launch."""
    from credit.kernels.gemm import _triton_kernel as tk

    a = C.rand(40, 11 * 32 - 5, dtype=BF16, device=D, seed=92)
    b = C.rand(11 * 32 - 5, 24, dtype=BF16, device=D, seed=93)
    whole = det_mm(a, b, backend=B, out_dtype=F32)
    saved, tk.max_depth = tk.max_depth, lambda dtype, major, split=False: 1
    try:
        split = det_mm(a, b, backend=B, out_dtype=F32)
    finally:
        tk.max_depth = saved
    C.same(split, whole, "host-split tree")
    C.check_tree_order(B, D, BF16, 40, 11 * 32 - 5, 24)


def occupancy_split() -> None:
    """A launch split into subtrees for occupancy (forced here: the interpreter never asks
    for it) gives the whole tree's bits: K = 37 leaves with a padded last one, split at two
    levels (subtrees of 10, 9, 9, 9 leaves), with one-leaf subtrees allowed at five, and with
    the subtree sums' buffer too small for any split, halved on the host down to 31 leaves;
    rounded once to bfloat16 and kept in fp32."""
    from credit.kernels.gemm import _triton

    k = 37 * 32 - 5
    for dtype, out in ((F32, F32), (BF16, BF16), (BF16, F32)):
        a = C.rand(70, k, dtype=dtype, device=D, seed=94)
        b = C.rand(k, 40, dtype=dtype, device=D, seed=95)
        whole = det_mm(a, b, backend=B, out_dtype=out)
        saved = _triton._programs_wanted, _triton.MIN_SUBTREE_LEAVES, _triton.PARTIALS_BYTES
        try:
            _triton._programs_wanted = lambda device: 1 << 20
            for min_leaves, levels, partials in ((8, 2, 1 << 20), (1, 5, 1 << 20), (8, 2, 1)):
                _triton.MIN_SUBTREE_LEAVES, _triton.PARTIALS_BYTES = min_leaves, partials
                assert _triton.split_levels(37, 2, (7, 7), 1 << 20) == levels
                C.same(det_mm(a, b, backend=B, out_dtype=out), whole,
                       f"{levels}-level split, {partials}-byte partials")
        finally:
            _triton._programs_wanted, _triton.MIN_SUBTREE_LEAVES, _triton.PARTIALS_BYTES = saved


def whole_linear() -> None:
    """A DetLinear whose reductions are marked whole gives the same output rows and input-
    gradient rows alone as in the batch (dW keeps the row tree), and its K differs in its last
    bits from the tree's (the chain is really taken)."""
    from credit.kernels.gemm import DetLinear

    torch.manual_seed(0)
    layer = DetLinear(300, 96, backend=B)
    x = C.rand(4, 9, 300, dtype=F32, device=D, seed=99).requires_grad_()
    tree = layer(x)
    layer.whole_reductions = (True, True)
    y = layer(x)
    assert not torch.equal(y, tree), "the whole-K chain gave the tree's bits everywhere"
    g = C.rand(4, 9, 96, dtype=F32, device=D, seed=100)
    y.backward(g)
    one = x.detach()[2:3, 4:5].clone().requires_grad_()
    y1 = layer(one)
    y1.backward(g[2:3, 4:5])
    C.same(y1, y[2:3, 4:5], "output row alone")
    C.same(one.grad, x.grad[2:3, 4:5], "input-gradient row alone")


def _conv_case(c_in: int, c_out: int, k: int, stride: int, padding: int, grid: tuple[int, int], batch: int,
               seed: int) -> tuple:
    """(geometry, x, weight, bias, upstream) of a small convolution."""
    from credit.models.deterministic.layers import ConvGeometry

    geometry = ConvGeometry((k, k), (stride, stride), (padding, padding), (1, 1))
    x = C.rand(batch, c_in, *grid, dtype=F32, device=D, seed=seed)
    weight = C.rand(c_out, c_in, k, k, dtype=F32, device=D, seed=seed + 1) * 0.2
    bias = C.rand(c_out, dtype=F32, device=D, seed=seed + 2)
    ho = (grid[0] + 2 * padding - k) // stride + 1
    wo = (grid[1] + 2 * padding - k) // stride + 1
    return geometry, x, weight, bias, C.rand(batch, c_out, ho, wo, dtype=F32, device=D, seed=seed + 3)


def _conv_run(conv, x, weight, bias, upstream) -> tuple:
    xi, wi, bi = (t.clone().requires_grad_() for t in (x, weight, bias))
    y = conv(xi, wi, bi)
    y.backward(upstream)
    return y.detach(), xi.grad, wi.grad, bi.grad


def conv_whole_reductions() -> None:
    """A deterministic convolution on the triton backend (the matrix path a GPU takes): its
    forward is one chain over K = C_in x kh x kw, its input gradient one chain over C_out
    (folded in col2im's order, or for stride 1 the chain of the adjoint convolution), its
    weight and bias gradients the row tree over each sample's positions padded to whole
    leaves; a slab at a time gives the same bits."""
    import torch.nn.functional as Fn

    from credit.kernels.gemm._ops import grouped_weight_grad, row_sum
    from credit.models.deterministic import conv as det_conv
    from credit.models.deterministic import layers
    from credit.models.deterministic.slabs import slab_conv2d

    saved, layers._BACKEND = layers._BACKEND, B
    try:
        for case in [(3, 5, 4, 2, 1, (10, 12), 2), (4, 6, 3, 1, 1, (7, 9), 2)]:
            c_in, c_out, k, stride, padding, grid, batch = case
            geometry, x, weight, bias, g = _conv_case(*case, seed=110)
            y, dx, dw, db = _conv_run(lambda a, w, b: layers._matrix_conv2d(a, w, b, geometry), x, weight, bias, g)
            cols = Fn.unfold(x, k, padding=padding, stride=stride).transpose(1, 2).reshape(-1, c_in * k * k)
            w2 = weight.reshape(c_out, -1)
            chain = det_mm(cols, w2.t(), backend=B, whole_k=True, out_dtype=F32) + bias
            C.same(y.permute(0, 2, 3, 1).reshape(-1, c_out), chain, f"{case}: forward, one chain over K")
            tree = det_mm(cols, w2.t(), backend=B, out_dtype=F32) + bias
            assert not torch.equal(chain, tree), f"{case}: the chain gave the tree's bits everywhere"
            g_rows = g.permute(0, 2, 3, 1).reshape(-1, c_out)
            C.same(dw, grouped_weight_grad(g_rows, cols, batch, B, F32).view(weight.shape), f"{case}: dW, row tree")
            C.same(db, row_sum(g_rows, batch, B, F32), f"{case}: db, row tree")
            if det_conv.input_grad_is_a_convolution(geometry):
                q = k - 1 - padding
                gcols = Fn.unfold(g, k, padding=q).transpose(1, 2).reshape(-1, c_out * k * k)
                adjoint = det_conv.adjoint_weight(weight).reshape(c_in, -1)
                want = det_mm(gcols, adjoint.t(), backend=B, whole_k=True).view(batch, *grid, c_in).permute(0, 3, 1, 2)
            else:
                patches = det_mm(g_rows, w2, backend=B, whole_k=True).view(batch, -1, c_in * k * k)
                want = Fn.fold(patches.transpose(1, 2), grid, k, padding=padding, stride=stride)
            C.same(dx, want, f"{case}: dx, one chain over C_out")
            adjoint_geometry = layers._adjoint(geometry) if det_conv.input_grad_is_a_convolution(geometry) else None
            for budget in (1, 3000):
                sliced = _conv_run(lambda a, w, b: slab_conv2d(a, w, b, geometry, adjoint_geometry, budget=budget,
                                                               backend=B), x, weight, bias, g)
                for what, want_t, got in zip(("output", "dx", "dW", "db"), (y, dx, dw, db), sliced):
                    C.same(got, want_t, f"{case}: slabs of {budget} bytes, {what}")
    finally:
        layers._BACKEND = saved


def conv_transpose_whole_reductions() -> None:
    """A deterministic transposed convolution on the triton backend: each input pixel's channels
    times the (C_in, C_out x kh x kw) weight as one chain over C_in."""
    from credit.models.deterministic import layers

    saved, layers._BACKEND = layers._BACKEND, B
    try:
        torch.manual_seed(0)
        for kernel, stride, padding in [(2, 2, 0), (4, 2, 1)]:
            layer = layers.DetConvTranspose2d(6, 4, kernel, stride=stride, padding=padding, bias=False)
            x = C.rand(2, 6, 5, 7, dtype=F32, device=D, seed=120)
            y = layer(x)
            rows = x.permute(0, 2, 3, 1).reshape(-1, 6)
            blocks = det_mm(rows, layer.weight.detach().reshape(6, -1), backend=B, whole_k=True)
            if kernel == stride:
                want = blocks.view(2, 5, 7, 4, kernel, kernel).permute(0, 3, 1, 4, 2, 5).reshape(2, 4, 5 * kernel,
                                                                                                  7 * kernel)
            else:
                want = torch.nn.functional.fold(blocks.view(2, 35, -1).transpose(1, 2), (10, 14), kernel,
                                                padding=padding, stride=stride)
            C.same(y.detach(), want, f"kernel {kernel}, stride {stride}: one chain over C_in")
    finally:
        layers._BACKEND = saved


CHECKS = {
    "registry": registry,
    "whole_k_f32": lambda: C.check_whole_k(B, D, F32, 150, 333, 70),
    "whole_k_bf16": lambda: C.check_whole_k(B, D, BF16, 150, 200, 70),
    "whole_linear": whole_linear,
    "conv_whole_reductions": conv_whole_reductions,
    "conv_transpose_whole_reductions": conv_transpose_whole_reductions,
    "accuracy_f32": lambda: C.check_accuracy(B, D, F32, 333, 96, 80),
    "accuracy_bf16": lambda: C.check_accuracy(B, D, BF16, 70, 100, 40),
    "accuracy_f16": lambda: C.check_accuracy(B, D, F16, 70, 100, 40),
    "backward_f32": lambda: C.check_backward(B, D, F32, 40, 70, 33),
    "backward_bf16": lambda: C.check_backward(B, D, BF16, 40, 70, 33),
    "row_invariance_f32": lambda: C.check_row_invariance(B, D, F32, 96, 40, (1, 64, 512)),
    "row_invariance_bf16": lambda: C.check_row_invariance(B, D, BF16, 64, 40, (1, 64, 130)),
    "chunking_f32": lambda: C.check_chunking(B, D, F32, 64, 40, (100, 156)),
    "padding_f16": lambda: C.check_padding(B, D, F16, 70, 64, 40),
    "n_invariance_f32": lambda: C.check_n_invariance(B, D, F32, 20, 64, 80),
    "k_split_2_f32": lambda: C.check_k_split(B, D, F32, 8, 192, 16, 2),
    "k_split_4_f32": lambda: C.check_k_split(B, D, F32, 8, 256, 16, 4),
    "k_split_8_bf16": lambda: C.check_k_split(B, D, BF16, 8, 256, 16, 8),
    "grad_row_invariance_f32": lambda: C.check_grad_row_invariance(B, D, F32, 70, 64, 40),
    "weight_grad_order_f32": lambda: C.check_weight_grad_order(B, D, F32, 48, 40),
    "run_to_run_bf16": lambda: C.check_run_to_run(B, D, BF16, 70, 64, 40),
    "tree_order_f32": lambda: C.check_tree_order(B, D, F32, 33, 13 * 32, 70),
    "tall_tree_bf16": tall_tree,
    "occupancy_split": occupancy_split,
}


def main() -> None:
    names = sys.argv[1:] or list(CHECKS)
    results = {}
    for name in names:
        try:
            CHECKS[name]()
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc(limit=3)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
