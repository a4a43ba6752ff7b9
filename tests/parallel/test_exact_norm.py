"""The order-free gradient norm: the correctly rounded exact value, whatever the split."""

import math
from fractions import Fraction

import torch

from credit.parallel.exact_norm import exact_grad_norm


def _elements() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    scales = 10.0 ** torch.randint(-30, 10, (5000,), generator=g).float()
    values = torch.randn(5000, generator=g) * scales
    values[:3] = torch.tensor([1e-45, -3e-42, 0.0])  # subnormals and a zero
    return values


def test_the_norm_is_the_correctly_rounded_exact_value():
    values = _elements()
    exact = sum(Fraction(float(v)) ** 2 for v in values.tolist())
    expected = math.sqrt(float(exact))  # float(exact): one rounding of the exact sum
    assert float(exact_grad_norm([values])) == expected
    plain = float(torch.linalg.vector_norm(values.double()))
    assert math.isclose(plain, expected, rel_tol=1e-12)  # sanity: it is the 2-norm


def test_splitting_and_ordering_change_no_bit():
    values = _elements()
    whole = exact_grad_norm([values])
    shuffled = values[torch.randperm(values.numel(), generator=torch.Generator().manual_seed(1))]
    assert torch.equal(exact_grad_norm(list(shuffled.split([1, 999, 2500, 1500]))), whole)
    assert torch.equal(exact_grad_norm([values.view(50, 100).t()]), whole)  # non-contiguous


def test_bfloat16_gradients_and_non_finite_ones():
    values = _elements().to(torch.bfloat16)
    exact = sum(Fraction(float(v)) ** 2 for v in values.float().tolist())
    assert float(exact_grad_norm([values])) == math.sqrt(float(exact))
    assert math.isinf(float(exact_grad_norm([torch.tensor([1.0, math.inf])])))
    assert not math.isfinite(float(exact_grad_norm([torch.tensor([1.0, math.nan])])))
