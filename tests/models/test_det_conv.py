"""The CPU gather path of the deterministic convolutions is bitwise their matrix definition:
output, input gradient, weight and bias gradients, on grids whose per-sample row counts are
and are not whole 32-row leaves."""

import pytest
import torch

from credit.models.deterministic import conv as det_conv
from credit.models.deterministic.layers import DetConv2d, DetConvTranspose2d


def _both_paths(layer, x: torch.Tensor, seed: int):
    """(output, dx, dW, db) of layer(x) via the gather path and via matrix_forward."""
    results = []
    for forward in (layer.forward, layer.matrix_forward):
        layer.zero_grad()
        xi = x.clone().requires_grad_(True)
        y = forward(xi)
        upstream = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed + 1))
        y.backward(upstream)
        results.append((y.detach(), xi.grad, layer.weight.grad.clone(),
                        None if layer.bias is None else layer.bias.grad.clone()))
    return results


def _same_bits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, what
    assert torch.equal(a.view(torch.int32), b.view(torch.int32)), f"{what} differs"


@pytest.mark.parametrize(
    "c_in, c_out, kernel, stride, padding, grid, batch",
    [
        (8, 16, 3, 1, 1, (8, 16), 2),     # 128 positions per sample: whole leaves
        (8, 16, 3, 1, 1, (9, 13), 3),     # 117: each sample padded to 128 rows
        (5, 12, 4, 2, 1, (10, 14), 2),    # overlapping strided patches (cross-embed)
        (5, 12, 2, 2, 0, (10, 14), 1),    # one sample: no per-sample padding
        (6, 8, 2, 3, 0, (9, 11), 2),      # disjoint patches with gaps: dx written in place
        (7, 9, 1, 1, 0, (6, 7), 4),
        (18, 64, 3, 1, 1, (5, 24), 2),    # K of two leaves and a partial one, whole panels
        (5, 12, 4, 2, 1, (6, 8), 3),      # 12 positions a sample: dW as g @ patches
        (64, 8, 3, 1, 1, (5, 6), 2),      # K of 18 leaves: the tree-top split, bias at its end
        (16, 16, 3, 1, 1, (8, 16), 2),    # g padded like x (kept buffers of one shape)
        (8, 16, 3, 1, 0, (9, 13), 2),     # no padding: g padded by 2 for dx
        (6, 5, 5, 1, 2, (7, 9), 3),       # 5 x 5
    ],
)
@pytest.mark.parametrize("weight_rows, g_rows", [(True, True), (False, False), (True, False), (False, True)],
                         ids=["W@patches,g@patches", "patches@Wt,patchesT@g", "W@patches,patchesT@g",
                              "patches@Wt,g@patches"])
def test_conv2d_gather_path_is_the_matrix_path(c_in, c_out, kernel, stride, padding, grid, batch,
                                               weight_rows, g_rows, monkeypatch):
    # both forward and both dW orientations on every machine (the choices depend on the
    # kernel's panel width, so a machine would otherwise test only the ones it picks)
    monkeypatch.setattr(det_conv, "_weight_rows_faster", lambda c_out, length: weight_rows)
    monkeypatch.setattr(det_conv, "_weight_grad_as_g_rows", lambda c_out, length, stride: g_rows)
    torch.manual_seed(0)
    layer = DetConv2d(c_in, c_out, kernel, stride=stride, padding=padding)
    x = torch.randn(batch, c_in, *grid)
    (gather, matrix) = _both_paths(layer, x, seed=3)
    for what, a, b in zip(("output", "dx", "dW", "db"), gather, matrix):
        _same_bits(a, b, what)


@pytest.mark.parametrize("samples_per_chunk", [1, 2])
def test_conv2d_input_grad_in_sample_chunks_is_the_matrix_path(samples_per_chunk, monkeypatch):
    # a strided convolution's patch gradients are written a few samples at a time (memory);
    # 5 samples in chunks of 1 and of 2 (a short last chunk) give the matrix path's dx
    torch.manual_seed(2)
    layer = DetConv2d(6, 10, 4, stride=2, padding=1)
    x = torch.randn(5, 6, 8, 10)
    one_sample = 6 * 16 * 4 * 5 * 4  # C_in·k·k patch entries at 4 x 5 positions, fp32
    monkeypatch.setattr(det_conv, "_DCOLS_CHUNK_BYTES", samples_per_chunk * one_sample)
    calls = []
    fold = det_conv._cpu.fold
    monkeypatch.setattr(det_conv._cpu, "fold", lambda cols, *a, **k: calls.append(len(cols)) or fold(cols, *a, **k))
    (gather, matrix) = _both_paths(layer, x, seed=7)
    assert calls == [samples_per_chunk] * (5 // samples_per_chunk) + [1] * (5 % samples_per_chunk)
    for what, a, b in zip(("output", "dx", "dW", "db"), gather, matrix):
        _same_bits(a, b, what)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kernel, stride, padding, grid, batch", [
    (2, 2, 0, (4, 8), 2), (4, 4, 0, (3, 5), 3), (2, 2, 0, (5, 7), 1),  # blocks side by side
    (4, 2, 1, (4, 8), 2),   # overlapping: CREDIT's output head (k=4, s=2, p=1)
    (4, 2, 1, (3, 5), 3),   # 15 input pixels a sample: dW's rows padded to a leaf
    (3, 1, 1, (5, 7), 1), (6, 2, 2, (4, 6), 2),
])
@pytest.mark.parametrize("weight_rows, g_rows", [(True, True), (False, False)])
def test_conv_transpose_gather_path_is_the_matrix_path(kernel, stride, padding, grid, batch, bias,
                                                       weight_rows, g_rows, monkeypatch):
    monkeypatch.setattr(det_conv, "_weight_rows_faster", lambda c_out, length: weight_rows)
    monkeypatch.setattr(det_conv, "_weight_grad_as_g_rows", lambda c_out, length, stride: g_rows)
    torch.manual_seed(1)
    layer = DetConvTranspose2d(12, 6, kernel_size=kernel, stride=stride, padding=padding, bias=bias)
    x = torch.randn(batch, 12, *grid)
    (gather, matrix) = _both_paths(layer, x, seed=5)
    for what, a, b in zip(("output", "dx", "dW", "db"), gather, matrix):
        if a is None:
            assert b is None
            continue
        _same_bits(a, b, what)
    # both anchored to torch's transposed convolution
    want = torch.nn.functional.conv_transpose2d(
        x.double(), layer.weight.double(), None if layer.bias is None else layer.bias.double(),
        stride=stride, padding=padding)
    assert torch.allclose(gather[0].double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel, stride, padding", [(3, 1, 1), (3, 1, 0), (5, 1, 2), (4, 2, 1), (2, 2, 0)])
def test_conv2d_gather_path_equals_torch_to_rounding(kernel, stride, padding):
    """Anchors both paths to torch's convolution (not only to each other): the output and
    every gradient, the stride-1 input gradients (a convolution of g) included."""
    torch.manual_seed(2)
    layer = DetConv2d(6, 10, kernel, stride=stride, padding=padding)
    x = torch.randn(2, 6, 7, 9, requires_grad=True)
    y = layer(x)
    g = torch.randn(y.shape)
    got = torch.autograd.grad(y, (x, layer.weight, layer.bias), g)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, layer.weight, layer.bias))
    want_y = torch.nn.functional.conv2d(x64, w64, b64, stride=stride, padding=padding)
    want = torch.autograd.grad(want_y, (x64, w64, b64), g.double())
    assert torch.allclose(y.double(), want_y, rtol=1e-5, atol=1e-5)
    for a, b in zip(got, want):
        assert torch.allclose(a.double(), b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel, stride, padding, dilation, grid", [
    (3, 1, 1, 1, (8, 16)), (4, 2, 1, 1, (10, 14)), (3, 2, 2, 2, (11, 9)), (2, 3, 0, 1, (9, 11)),
])
def test_cpu_fold_has_torch_folds_bits(kernel, stride, padding, dilation, grid):
    from credit.kernels.gemm import _cpu

    k, s, p, d = (kernel,) * 2, (stride,) * 2, (padding,) * 2, (dilation,) * 2
    image = torch.zeros(3, 5, *grid)
    length = torch.nn.functional.unfold(image, k, dilation=d, padding=p, stride=s).shape[-1]
    cols = torch.randn(3, 5 * kernel * kernel, length)
    cols[0, :, 0] = -0.0  # a lone -0 contribution sums to +0, as in col2im
    want = torch.nn.functional.fold(cols, grid, k, dilation=d, padding=p, stride=s)
    got = _cpu.fold(cols, grid, k, p, s, d)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
