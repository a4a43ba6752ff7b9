"""AdamW written with single-rounding elementwise ops (deterministic mode).

torch's AdamW uses `lerp_`, `addcmul_` and `addcdiv_`, whose vectorised loops fuse a
multiply-add while the scalar loop for an array's tail may not; sharding (FSDP2's dim-0
chunks, tensor-parallel shards) moves elements between body and tail, so the same element
could be updated with different bits in different layouts. Each op here (multiply, add,
divide, square root by a tensor or a scalar) is one IEEE rounding in either loop. Same
state keys as `torch.optim.AdamW` (step, exp_avg, exp_avg_sq), so checkpoints load either way.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class ElementwiseAdamW(torch.optim.Optimizer):
    def __init__(self, params: Iterable[torch.Tensor], lr: float, betas: tuple[float, float],
                 eps: float, weight_decay: float) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        if closure is not None:
            raise ValueError("ElementwiseAdamW.step takes no closure")
        for group in self.param_groups:
            lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad, state = param.grad, self.state[param]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                state["step"] += 1
                step = float(state["step"])
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                if decay:
                    param.mul_(1.0 - lr * decay)
                exp_avg.mul_(beta1).add_(grad * (1.0 - beta1))
                exp_avg_sq.mul_(beta2).add_((grad * grad) * (1.0 - beta2))
                denom = (exp_avg_sq / (1.0 - beta2**step)).sqrt_().add_(eps)
                param.sub_((exp_avg / (1.0 - beta1**step)) / denom * lr)
        return None
