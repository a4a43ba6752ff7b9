"""ElementwiseAdamW: the documented single-rounding op sequence, list-wide or per parameter
with the same bits, and AdamW's update to rounding."""

import pytest
import torch

from credit.train.elementwise_adamw import ElementwiseAdamW

HYPER = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in ((37, 5), (129,), (3, 4, 5))]


def _run(optimizer_cls, foreach: bool | None, steps: int = 4) -> list[torch.Tensor]:
    params = _params(0)
    opt = optimizer_cls(params, **HYPER)
    for group in opt.param_groups:
        group["foreach"] = foreach
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return [p.detach().clone() for p in params]


def _reference(steps: int = 4) -> list[torch.Tensor]:
    """The op sequence written out one tensor and one op at a time."""
    lr, (b1, b2), eps, wd = HYPER["lr"], HYPER["betas"], HYPER["eps"], HYPER["weight_decay"]
    params = [p.detach().clone() for p in _params(0)]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    g = torch.Generator().manual_seed(1)
    for step in range(1, steps + 1):
        grads = [torch.randn(p.shape, generator=g) for p in params]
        for p, gr, mi, vi in zip(params, grads, m, v):
            p.mul_(1.0 - lr * wd)
            mi.mul_(b1).add_(gr * (1.0 - b1))
            vi.mul_(b2).add_((gr * gr) * (1.0 - b2))
            denom = (vi / (1.0 - b2**step)).sqrt_().add_(eps)
            p.sub_((mi / (1.0 - b1**step)) / denom * lr)
    return params


@pytest.mark.parametrize("foreach", [True, False, None])
def test_update_is_the_documented_op_sequence_bitwise(foreach):
    for got, want in zip(_run(ElementwiseAdamW, foreach), _reference()):
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_update_matches_torch_adamw_to_rounding():
    for got, want in zip(_run(ElementwiseAdamW, True), _run(torch.optim.AdamW, False)):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
