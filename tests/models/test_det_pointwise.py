"""Deterministic-mode activations give each element the same bits whatever the size of the
tensor it sits in (torch's CPU kernels round a vectorised block and a scalar remainder
differently for erf and exp): a sample's values do not change with the batch around it or
with a tensor-parallel shard's width, forward and backward."""

import pytest
import torch
from torch import nn

from credit.models.deterministic.pointwise import DetGELU, DetSigmoid, DetSiLU, sigmoid

OPS = {
    "gelu": (DetGELU(), nn.GELU()),
    "gelu_tanh": (DetGELU(approximate="tanh"), nn.GELU(approximate="tanh")),
    "silu": (DetSiLU(), nn.SiLU()),
    "sigmoid": (lambda x: sigmoid(x, True), torch.sigmoid),
    "sigmoid_module": (DetSigmoid(), nn.Sigmoid()),
}


def _values_and_grads(fn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    y = fn(x)
    y.backward(torch.linspace(-1.0, 1.0, x.numel()).view(x.shape))
    return y.detach(), x.grad


@pytest.mark.parametrize("name", sorted(OPS))
def test_prefixes_of_a_tensor_keep_their_bits(name):
    det, _ = OPS[name]
    x = torch.randn(4, 70, generator=torch.Generator().manual_seed(3)) * 3
    y_all, g_all = _values_and_grads(det, x)
    # the first k rows alone: the "batch" of k samples against the batch of 4, and a
    # row-major prefix that does not end on a vector block
    for k in (1, 2, 3):
        y, _ = _values_and_grads(det, x[:k])
        assert torch.equal(y, y_all[:k]), f"{name}: {k} samples"
    for n in (1, 17, 63, 65, 129, 200):
        flat = x.reshape(-1)[:n]
        y, _ = _values_and_grads(det, flat)
        assert torch.equal(y, y_all.reshape(-1)[:n]), f"{name}: first {n} elements"
    # the backward too (gradient of a prefix against the prefix of the whole's gradient,
    # with each element's upstream value fixed)
    up = torch.randn(x.shape, generator=torch.Generator().manual_seed(4))
    xs = x.clone().requires_grad_(True)
    det(xs).backward(up)
    for k in (1, 3):
        xk = x[:k].clone().requires_grad_(True)
        det(xk).backward(up[:k])
        assert torch.equal(xk.grad, xs.grad[:k]), f"{name}: gradient of {k} samples"


@pytest.mark.parametrize("name", sorted(OPS))
def test_values_are_torch_values(name):
    # on a whole number of blocks the op is torch's own
    det, ref = OPS[name]
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(5))
    assert torch.equal(det(x), ref(x))
    odd = torch.randn(5, 13, generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(det(odd), ref(odd), rtol=1e-6, atol=1e-7)


def test_non_contiguous_input_keeps_its_shape_and_values():
    x = torch.randn(6, 10, generator=torch.Generator().manual_seed(7)).t()
    y = DetGELU()(x)
    assert y.shape == x.shape
    assert torch.equal(y, DetGELU()(x.contiguous()))
