"""The fused CPU passes of deterministic mode (credit.kernels.elementwise) give the bits of
the torch ops they replace: ElementwiseAdamW's list-wide update and exact_norm's integer
square sums; and an element's update does not depend on where a shard boundary falls."""

from __future__ import annotations

import math

import pytest
import torch

from credit.kernels import elementwise
from credit.parallel.exact_norm import _bins, bins_torch, exact_grad_norm
from credit.train.elementwise_adamw import ElementwiseAdamW

SIZES = (1, 7, 33, 4099, 100_003)


@pytest.fixture(scope="module")
def kernel():
    module = elementwise.load()
    assert module is not None, "the elementwise extension must build where the CPU GEMM builds"
    return module


def _rows(seed: int) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in SIZES:
        p = torch.randn(n, generator=g)
        rows.append([p, torch.randn(n, generator=g) * 1e-2, torch.randn(n, generator=g) * 1e-3,
                     torch.rand(n, generator=g) * 1e-5])
    return rows


@pytest.mark.parametrize("decay", [0.0, 0.1])
def test_fused_adamw_equals_the_list_wide_ops(kernel, decay):
    opt = ElementwiseAdamW([torch.zeros(1)], lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=decay)
    group = opt.param_groups[0]
    fused, reference = _rows(0), [[t.clone() for t in row] for row in _rows(0)]
    for step in (1.0, 2.0, 7.0):
        opt._update(fused, [step] * len(fused), group)
        opt._update_foreach(reference, [step] * len(reference), group)
        for mine, theirs in zip(fused, reference):
            for a, b in zip(mine, theirs):
                assert torch.equal(a, b)


def test_a_shard_boundary_changes_no_bit(kernel):
    opt = ElementwiseAdamW([torch.zeros(1)], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    whole = _rows(1)[-1]
    halves = [[t[:50_001].clone() for t in whole], [t[50_001:].clone() for t in whole]]
    opt._update([whole], [3.0], opt.param_groups[0])
    opt._update(halves, [3.0, 3.0], opt.param_groups[0])
    for k in range(4):
        assert torch.equal(whole[k], torch.cat([halves[0][k], halves[1][k]]))


def test_square_bins_equal_torchs_and_the_norm_is_exact(kernel):
    g = torch.Generator().manual_seed(2)
    values = torch.cat([torch.randn(300_001, generator=g) * 10.0 ** torch.randint(-30, 30, (300_001,), generator=g),
                        torch.tensor([0.0, -0.0, 1e-45, -3e-39, 3.4e38, float("inf")])])
    assert torch.equal(_bins([values]), bins_torch(values))
    parts = list(values.split([7, 250_000, 50_000]))  # several tensors: the bins of their union
    assert torch.equal(_bins(parts), bins_torch(values))
    finite = values[torch.isfinite(values)][:1000]
    squares = math.fsum(float(x) ** 2 for x in finite.double())  # exact squares, one rounding of the sum
    assert torch.equal(exact_grad_norm([finite]), torch.tensor(squares, dtype=torch.float64).sqrt())
