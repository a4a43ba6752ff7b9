"""The deterministic LayerNorm's one-pass pieces: torch's normalisation with a unit affine has
the bits of none, the one-pass affine has the bits of torch's `x * w + b`, and the layer
matches torch's LayerNorm and gives a sample the same bits alone or in a batch."""

import pytest
import torch
import torch.nn.functional as F

from credit.kernels.gemm import _cpu
from credit.models.deterministic.layers import DetLayerNorm


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
