"""CREDIT's `grad_max_norm: dynamic`: the limit is sqrt(ranks x the norm), so a norm above
1 (one rank) is brought down to its square root and one below 1 is left alone; the fast and
the deterministic clip agree."""

import math

import pytest
import torch

from credit.parallel import clip_grad_norm_
from credit.parallel.exact_norm import clip_grad_norm_exact_


def _params(scale: float) -> list[torch.nn.Parameter]:
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))]
    params[0].grad = torch.tensor([3.0, 0.0, 0.0]) * scale
    params[1].grad = torch.tensor([[0.0, 4.0], [0.0, 0.0]]) * scale  # norm 5 x scale
    return params


@pytest.mark.parametrize("clip", ["fast", "exact"])
@pytest.mark.parametrize("scale, ranks", [(1.0, 1), (4.0, 2), (0.1, 1)])
def test_dynamic_limit_is_the_root_of_ranks_times_the_norm(clip, scale, ranks):
    params = _params(scale)
    norm = 5.0 * scale
    if clip == "fast":
        before = float(clip_grad_norm_(params, math.inf, dynamic_scale=float(ranks)))
    else:
        before = clip_grad_norm_exact_(params, math.inf, float(ranks))
    after = math.sqrt(sum(float((p.grad ** 2).sum()) for p in params))
    assert before == pytest.approx(norm)
    assert after == pytest.approx(min(norm, math.sqrt(ranks * norm)), rel=1e-5)
