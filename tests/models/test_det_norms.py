"""The deterministic LayerNorm's one-pass pieces: torch's normalisation with a unit affine has
the bits of none, the one-pass affine has the bits of torch's `x * w + b`, the CPU kernel's
layer norms of narrow and wide rows are layer norms whose rows do not see each other (the wide
one in the lane order it promises), and the layer matches torch's LayerNorm and gives a
sample the same bits alone or in a batch."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from credit.kernels.gemm import _cpu
from credit.models.deterministic.norms import DetGroupNorm, DetLayerNorm


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


@pytest.mark.parametrize("shape", [(16, 512, 32), (8192, 32), (5, 7, 48), (3, 100), (4, 9, 7)])
def test_layer_norm_with_a_unit_affine_has_the_bits_of_none(shape):
    gen = torch.Generator().manual_seed(51)
    x = (torch.randn(shape, generator=gen) * 3 + 1).requires_grad_()
    g = torch.randn(shape, generator=gen)
    c = shape[-1]
    plain = F.layer_norm(x, (c,))
    (dx_plain,) = torch.autograd.grad(plain, x, g)
    unit = F.layer_norm(x, (c,), torch.ones(c), torch.zeros(c))
    (dx_unit,) = torch.autograd.grad(unit, x, g)
    assert torch.equal(_bits(plain), _bits(unit))
    assert torch.equal(_bits(dx_plain), _bits(dx_unit))


@pytest.mark.parametrize("rows, cols", [(8192, 32), (100, 7), (3, 1), (33, 129)])
def test_one_pass_affine_has_the_bits_of_torchs_two_ops(rows, cols):
    gen = torch.Generator().manual_seed(52)
    x, w, b = torch.randn(rows, cols, generator=gen), torch.randn(cols, generator=gen), torch.randn(cols, generator=gen)
    x[::5, 0] = -0.0
    assert torch.equal(_bits(_cpu.affine(x, w, b)), _bits(x * w + b))


def test_det_layer_norm_matches_torch_and_is_batch_invariant():
    torch.manual_seed(3)
    det, ref = DetLayerNorm(32), torch.nn.LayerNorm(32)
    with torch.no_grad():
        det.weight.normal_(), det.bias.normal_()
    ref.load_state_dict(det.state_dict())
    x = torch.randn(8, 64, 32, requires_grad=True)
    g = torch.randn(8, 64, 32)
    y = det(x)
    dx, dw, db = torch.autograd.grad(y, (x, det.weight, det.bias), g)
    y_ref = ref(x)
    want = torch.autograd.grad(y_ref, (x, ref.weight, ref.bias), g)
    assert torch.allclose(y, y_ref, atol=1e-5)
    for got, exp in zip((dx, dw, db), want):
        assert torch.allclose(got, exp, atol=1e-4, rtol=1e-4)
    one = x[3:4].detach().requires_grad_()
    y_one = det(one)
    (dx_one,) = torch.autograd.grad(y_one, one, g[3:4])
    assert torch.equal(_bits(y_one), _bits(y[3:4]))
    assert torch.equal(_bits(dx_one), _bits(dx[3:4]))


@pytest.mark.parametrize("rows, width", [(131, 4), (37, 1), (16, 8), (50, 7), (20, 33)])
def test_cpu_layer_norm_is_a_layer_norm_and_each_row_its_own(rows, width):
    """The kernel's output, normed values and input gradient are float64's layer norm to fp32
    rounding; each row's bits are those of the row alone (rows go through the kernel sixteen
    at a time); the weight and bias gradients are the row tree's (`affine_grads`)."""
    gen = torch.Generator().manual_seed(53)
    x = torch.randn(rows, width, generator=gen) * 3 + 1
    w, b = torch.randn(width, generator=gen), torch.randn(width, generator=gen)
    g = torch.randn(rows, width, generator=gen)
    y, normed, rstd = _cpu.layer_norm(x, w, b, 1e-5)
    x64 = x.double().requires_grad_()
    y64 = F.layer_norm(x64, (width,), w.double(), b.double(), 1e-5)
    (dx64,) = torch.autograd.grad(y64, x64, g.double())
    assert torch.allclose(y.double(), y64, atol=1e-5)
    g_normed, _, _ = _cpu.affine_grads(g, normed, w, 1)
    dx = _cpu.layer_norm_input_grad(g_normed, normed, rstd)
    assert torch.allclose(dx.double(), dx64, atol=1e-3 * max(1.0, dx64.abs().max().item()))
    for i in (0, rows // 2, rows - 1):
        y_one, normed_one, rstd_one = _cpu.layer_norm(x[i:i + 1], w, b, 1e-5)
        assert torch.equal(_bits(y_one[0]), _bits(y[i])) and torch.equal(_bits(rstd_one), _bits(rstd[i:i + 1]))
        gn_one, _, _ = _cpu.affine_grads(g[i:i + 1], normed_one, w, 1)
        assert torch.equal(_bits(_cpu.layer_norm_input_grad(gn_one, normed_one, rstd_one)[0]), _bits(dx[i]))


def _lane_sum(v: torch.Tensor) -> torch.Tensor:
    """The wide-row kernel's sum of each row of fp32 `v (rows, D)`: 16 chains, chain l adding
    columns l, l + 16, ... from +0 in order, then the halving tree (l + h into l, h = 8..1)."""
    part = torch.zeros(v.shape[0], 16)
    for j in range(0, v.shape[1], 16):
        width = min(16, v.shape[1] - j)
        part[:, :width] = part[:, :width] + v[:, j:j + width]
    for h in (8, 4, 2, 1):
        part[:, :h] = part[:, :h] + part[:, h:2 * h]
    return part[:, 0]


@pytest.mark.parametrize("rows, width, groups", [(64, 32, 2), (45, 9, 3), (40, 100, 4), (33, 16, 1), (8, 256, 8)])
def test_wide_row_kernel_has_the_bits_of_its_lane_order(rows, width, groups):
    """`layer_norm_rows` and its gradients against the order they promise, written with torch's
    fp32 ops (each rounding where the kernel rounds); the affine gradients are `affine_grads`'
    row-tree sums of g and g times the normed rows."""
    gen = torch.Generator().manual_seed(55)
    x = torch.randn(rows, width, generator=gen) * 3 + 1
    w, b = torch.randn(width, generator=gen), torch.randn(width, generator=gen)
    g = torch.randn(rows, width, generator=gen)
    y, mean, rstd = _cpu.layer_norm_rows(x, w, b, 1e-5)
    want_mean = _lane_sum(x) / width
    d = x - want_mean[:, None]
    var = (_lane_sum(d * d) / width).numpy()
    # numpy's fp32 sqrt and division round as IEEE (and the C++) do; torch's vector sqrt may not
    want_rstd = torch.from_numpy(np.float32(1.0) / np.sqrt(var + np.float32(1e-5)))
    h = d * want_rstd[:, None]
    assert torch.equal(_bits(mean), _bits(want_mean)) and torch.equal(_bits(rstd), _bits(want_rstd))
    assert torch.equal(_bits(y), _bits(h * w + b))
    gx, gw, gb = _cpu.layer_norm_rows_grads(g, x, mean, rstd, w, groups)
    gn = g * w
    want_gx = want_rstd[:, None] * ((gn - (_lane_sum(gn) / width)[:, None]) - h * (_lane_sum(gn * h) / width)[:, None])
    _, want_gw, want_gb = _cpu.affine_grads(g, h, w, groups)
    for got, want in ((gx, want_gx), (gw, want_gw), (gb, want_gb)):
        assert torch.equal(_bits(got), _bits(want))
    x64 = x.double().requires_grad_()
    y64 = F.layer_norm(x64, (width,), w.double(), b.double(), 1e-5)
    (dx64,) = torch.autograd.grad(y64, x64, g.double())
    assert torch.allclose(y.double(), y64, atol=1e-5)
    assert torch.allclose(gx.double(), dx64, atol=1e-3 * max(1.0, dx64.abs().max().item()))


@pytest.mark.parametrize("width, kernel", [(4, "_RowLayerNorm"), (48, "_WideRowLayerNorm")])
def test_det_layer_norm_takes_the_row_kernels_and_is_batch_invariant(width, kernel):
    """A column attention's norm (4 channels a row) and a wider one run through the CPU
    kernels, match torch's LayerNorm, and give a sample the same output and gradients alone or
    in a batch."""
    torch.manual_seed(4)
    det, ref = DetLayerNorm(width), torch.nn.LayerNorm(width)
    with torch.no_grad():
        det.weight.normal_(), det.bias.normal_()
    ref.load_state_dict(det.state_dict())
    x = torch.randn(6, 37, 5, width).permute(0, 2, 1, 3).requires_grad_()  # strided, as the model's
    g = torch.randn(6, 5, 37, width)
    y = det(x)
    assert type(y.grad_fn).__name__ == kernel + "Backward"
    dx, dw, db = torch.autograd.grad(y, (x, det.weight, det.bias), g)
    want = torch.autograd.grad(ref(x), (x, ref.weight, ref.bias), g)
    assert torch.allclose(y, ref(x), atol=1e-5)
    for got, exp in zip((dx, dw, db), want):
        assert torch.allclose(got, exp, atol=1e-4, rtol=1e-4)
    one = x[2:3].detach().requires_grad_()
    y_one = det(one)
    (dx_one,) = torch.autograd.grad(y_one, one, g[2:3])
    assert torch.equal(_bits(y_one), _bits(y[2:3].contiguous()))
    assert torch.equal(_bits(dx_one.contiguous()), _bits(dx[2:3].contiguous()))
    # the weight and bias gradients: the row tree over whole samples, a split batch's halves add up
    halves = [torch.autograd.grad(det(x[i:i + 3]), (det.weight, det.bias), g[i:i + 3]) for i in (0, 3)]
    for k, whole in enumerate((dw, db)):
        assert torch.equal(_bits(halves[0][k] + halves[1][k]), _bits(whole))


def _plane_lanes(v: torch.Tensor) -> torch.Tensor:
    """The group-norm kernel's sum over each row of fp32 `v (rows, planes, P)`: 16 chains over
    each plane's positions (chain l: positions l, l + 16, ...), running on across the planes
    in order, then the halving tree."""
    part = torch.zeros(v.shape[0], 16)
    for c in range(v.shape[1]):
        for j in range(0, v.shape[2], 16):
            width = min(16, v.shape[2] - j)
            part[:, :width] = part[:, :width] + v[:, c, j:j + width]
    for h in (8, 4, 2, 1):
        part[:, :h] = part[:, :h] + part[:, h:2 * h]
    return part[:, 0]


@pytest.mark.parametrize("shape, groups", [((4, 8, 4, 8), 2), ((3, 6, 5, 7), 3), ((2, 4, 9, 9), 1), ((5, 32, 2, 4), 8)])
def test_group_norm_kernel_has_the_bits_of_its_order_and_a_sample_its_own(shape, groups):
    """`group_norm` and its gradients against the order they promise (each sample's group a
    run of planes summed in lanes; the affine gradients each sample's lane sums over its
    positions, then the tree over samples), written with torch's fp32 ops; a sample's output
    and input gradient are its own; and float64's group norm to fp32 rounding."""
    from credit.kernels.gemm._tree import tree_sum

    gen = torch.Generator().manual_seed(56)
    b, c = shape[:2]
    x = torch.randn(shape, generator=gen) * 2 + 0.5
    w, bias = torch.randn(c, generator=gen), torch.randn(c, generator=gen)
    g = torch.randn(shape, generator=gen)
    y, mean, rstd = _cpu.group_norm(x, w, bias, groups, 1e-5)
    runs = x.reshape(b * groups, c // groups, -1)
    n = runs[0].numel()
    want_mean = _plane_lanes(runs) / n
    d = runs - want_mean[:, None, None]
    var = (_plane_lanes(d * d) / n).numpy()
    want_rstd = torch.from_numpy(np.float32(1.0) / np.sqrt(var + np.float32(1e-5)))
    h = (d * want_rstd[:, None, None]).reshape(shape)
    assert torch.equal(_bits(mean), _bits(want_mean)) and torch.equal(_bits(rstd), _bits(want_rstd))
    assert torch.equal(_bits(y), _bits(h * w.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1)))
    gx, gw, gb = _cpu.group_norm_grads(g, x, mean, rstd, w, groups)
    gn = g * w.view(1, -1, 1, 1)
    hr, gnr = h.reshape(runs.shape), gn.reshape(runs.shape)
    mean_g, mean_gh = _plane_lanes(gnr) / n, _plane_lanes(gnr * hr) / n
    want_gx = want_rstd[:, None, None] * ((gnr - mean_g[:, None, None]) - hr * mean_gh[:, None, None])
    assert torch.equal(_bits(gx), _bits(want_gx.reshape(shape)))
    per_sample_w = _plane_lanes((g * h).reshape(b * c, 1, -1)).view(b, c)
    per_sample_b = _plane_lanes(g.reshape(b * c, 1, -1)).view(b, c)
    assert torch.equal(_bits(gw), _bits(tree_sum(list(per_sample_w.unbind(0)))))
    assert torch.equal(_bits(gb), _bits(tree_sum(list(per_sample_b.unbind(0)))))
    y_one, _, _ = _cpu.group_norm(x[1:2], w, bias, groups, 1e-5)
    gx_one, _, _ = _cpu.group_norm_grads(g[1:2], x[1:2], mean[groups:2 * groups], rstd[groups:2 * groups], w, groups)
    assert torch.equal(_bits(y_one), _bits(y[1:2])) and torch.equal(_bits(gx_one), _bits(gx[1:2]))
    x64 = x.double().requires_grad_()
    y64 = F.group_norm(x64, groups, w.double(), bias.double(), 1e-5)
    (dx64,) = torch.autograd.grad(y64, x64, g.double())
    assert torch.allclose(y.double(), y64, atol=1e-5)
    assert torch.allclose(gx.double(), dx64, atol=1e-3 * max(1.0, dx64.abs().max().item()))


def test_det_group_norm_takes_the_kernel_and_splits_of_a_batch_add_up():
    """DetGroupNorm runs through the kernel, matches torch's GroupNorm, and a batch split in
    halves whose affine gradients are added gives the whole batch's bits."""
    torch.manual_seed(5)
    det, ref = DetGroupNorm(4, 16), torch.nn.GroupNorm(4, 16)
    with torch.no_grad():
        det.weight.normal_(), det.bias.normal_()
    ref.load_state_dict(det.state_dict())
    x = torch.randn(8, 16, 6, 10, requires_grad=True)
    g = torch.randn(8, 16, 6, 10)
    y = det(x)
    assert type(y.grad_fn).__name__ == "_PlanarGroupNormBackward"
    got = torch.autograd.grad(y, (x, det.weight, det.bias), g)
    want = torch.autograd.grad(ref(x), (x, ref.weight, ref.bias), g)
    assert torch.allclose(y, ref(x), atol=1e-5)
    for a, e in zip(got, want):
        assert torch.allclose(a, e, atol=1e-4, rtol=1e-4)
    halves = [torch.autograd.grad(det(x[i:i + 4]), (det.weight, det.bias), g[i:i + 4]) for i in (0, 4)]
    for k in (0, 1):
        assert torch.equal(_bits(halves[0][k] + halves[1][k]), _bits(got[k + 1]))
    # off the kernel (here bfloat16; on a GPU any dtype): torch's normalisation and `channel_affine`
    det16, x16 = det.bfloat16(), x.detach().bfloat16().requires_grad_()
    y16 = det16(x16)
    assert "PlanarGroupNorm" not in type(y16.grad_fn).__name__
    got16 = torch.autograd.grad(y16, (x16, det16.weight, det16.bias), g.bfloat16())
    for a, e in zip(got16, got):
        assert torch.allclose(a.float(), e, atol=0.02 * e.abs().max().item(), rtol=0.02)


@pytest.mark.parametrize("layer, shape", [(lambda: DetLayerNorm(32), (0, 5, 32)), (lambda: DetLayerNorm(32), (2, 0, 32)),
                                          (lambda: DetLayerNorm(4), (0, 3, 4)), (lambda: DetGroupNorm(2, 4), (0, 4, 3, 3))])
def test_det_norms_of_no_rows_give_empty_outputs_and_zero_gradients(layer, shape):
    """An empty batch (or a sample with no rows) is torch's: nothing to reduce."""
    norm = layer()
    x = torch.randn(shape, requires_grad=True)
    y = norm(x)
    y.sum().backward()
    assert y.shape == x.shape and x.grad.shape == x.shape
    assert torch.equal(norm.weight.grad, torch.zeros_like(norm.weight))
    assert torch.equal(norm.bias.grad, torch.zeros_like(norm.bias))
