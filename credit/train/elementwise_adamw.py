"""AdamW written with single-rounding elementwise ops (deterministic mode).

torch's AdamW uses `lerp_`, `addcmul_` and `addcdiv_`, whose vectorised loops fuse a
multiply-add while the scalar loop for an array's tail may not; sharding (FSDP2's dim-0
chunks, tensor-parallel shards) moves elements between body and tail, so the same element
could be updated with different bits in different layouts. Each op here (multiply, add,
divide, square root by a tensor or a scalar) is one IEEE rounding in either loop, run as
torch's list-wide `_foreach_*` ops (the same single-rounding op per element, fewer calls).
On the CPU the same operations run in one fused pass per tensor
(`credit.kernels.elementwise`), with the same bits. Same state keys as `torch.optim.AdamW`
(step, exp_avg, exp_avg_sq), so checkpoints load either way. The update runs on local shards where the layouts allow
(`credit.train.shard_local`): the same bits, without DTensor's sharding propagation.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from credit.kernels import elementwise
from credit.parallel.local_shards import map_shards
from credit.train.shard_local import FirstStepState, local_rows


class ElementwiseAdamW(FirstStepState, torch.optim.Optimizer):
    def __init__(self, params: Iterable[torch.Tensor], lr: float, betas: tuple[float, float],
                 eps: float, weight_decay: float) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def _state(self, param: torch.Tensor, group: dict) -> dict:
        state = self.state[param]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = map_shards(param, torch.zeros_like)
            state["exp_avg_sq"] = map_shards(param, torch.zeros_like)
        return state

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        if closure is not None:
            raise ValueError("ElementwiseAdamW.step takes no closure")
        for group in self.param_groups:
            live = [p for p in group["params"] if p.grad is not None]
            for param in live:
                self._state(param, group)["step"] += 1
            steps = [float(self.state[p]["step"]) for p in live]
            rows = [[p, p.grad, self.state[p]["exp_avg"], self.state[p]["exp_avg_sq"]] for p in live]
            for chunk, _ in local_rows(rows, group.get("foreach")):  # the same ops either way
                self._update([rows[k] for k in chunk], [steps[k] for k in chunk], group)
        return None

    def _update(self, rows: list[list[torch.Tensor]], steps: list[float], group: dict) -> None:
        lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        rest = []
        for row, step in zip(rows, steps):
            kernel = elementwise.fused(*row)
            if kernel is None:
                rest.append((row, step))
                continue
            kernel.det_adamw(*row, 1.0 - lr * decay, bool(decay), beta1, 1.0 - beta1, beta2, 1.0 - beta2,
                             1.0 - beta1**step, 1.0 - beta2**step, eps, lr)
        if rest:
            self._update_foreach([row for row, _ in rest], [step for _, step in rest], group)

    def _update_foreach(self, rows: list[list[torch.Tensor]], steps: list[float], group: dict) -> None:
        lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        params, grads, exp_avg, exp_avg_sq = (list(column) for column in zip(*rows))
        if decay:
            torch._foreach_mul_(params, 1.0 - lr * decay)
        torch._foreach_mul_(exp_avg, beta1)
        torch._foreach_add_(exp_avg, torch._foreach_mul(grads, 1.0 - beta1))
        torch._foreach_mul_(exp_avg_sq, beta2)
        squares = torch._foreach_mul(grads, grads)
        torch._foreach_mul_(squares, 1.0 - beta2)
        torch._foreach_add_(exp_avg_sq, squares)
        denom = torch._foreach_div(exp_avg_sq, [1.0 - beta2**s for s in steps])
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, eps)
        update = torch._foreach_div(exp_avg, [1.0 - beta1**s for s in steps])
        torch._foreach_div_(update, denom)
        torch._foreach_mul_(update, lr)
        torch._foreach_sub_(params, update)
