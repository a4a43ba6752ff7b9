"""Optimizer updates on the local shards of DTensor parameters.

An AdamW update is elementwise: a DTensor op on tensors that share one mesh and placement
runs the same op on each rank's local shard. Running it on the local shards directly gives
the same bits and skips DTensor's sharding propagation, which for list-wide (`_foreach_*`)
ops over every parameter costs seconds of CPU per rank on the first step, and a dispatch
per list on every later one. A parameter whose gradient still holds a pending reduction
(`Partial`), or whose state has another layout, keeps the DTensor ops.

`ShardLocalAdamW` is torch's AdamW (state layout, checkpoints and results unchanged; the
state stays DTensor, only the update reads local views of it), for the fast mode;
the deterministic mode's `ElementwiseAdamW` uses `local_rows` the same way. Either runs
list-wide (`_foreach_*`) ops over all localized rows at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.tensor import DTensor
from torch.optim.adamw import adamw

from credit.parallel.local_shards import map_shards

__all__ = ["FirstStepState", "ShardLocalAdamW", "local_rows"]


def _zeros(tensor: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(tensor, memory_format=torch.preserve_format)  # torch's AdamW state


def _same_layout(row: Sequence[torch.Tensor]) -> bool:
    """All plain tensors, or DTensors of one mesh, placement and shape with nothing pending."""
    first = row[0]
    if not isinstance(first, DTensor):
        return not any(isinstance(t, DTensor) for t in row)
    return (all(isinstance(t, DTensor) and t.device_mesh == first.device_mesh and t.placements == first.placements
                and t.shape == first.shape for t in row)
            and not any(p.is_partial() for p in first.placements))


def local_rows(rows: list[list[torch.Tensor]], foreach: bool | None) -> list[tuple[list[int], bool]]:
    """Localize `rows` (a parameter, its gradient and its state tensors, each) in place where
    their layout allows, and group their indices for list-wide ops, each group with whether
    to run it list-wide: the rows now holding plain tensors together (list-wide); the rest
    together when `foreach` (the trainer sets it where DTensor's foreach ops accept those
    tensors), else one by one."""
    plain, kept = [], []
    for k, row in enumerate(rows):
        if _same_layout(row):
            rows[k] = [t.to_local() if isinstance(t, DTensor) else t for t in row]
            plain.append(k)
        else:
            kept.append(k)
    chunks = [(plain, True)] if plain else []
    if kept:
        chunks += [(kept, True)] if foreach else [([k], False) for k in kept]
    return chunks


class FirstStepState:
    """`init_state` for an optimizer whose `_state(param, group)` makes a parameter's state
    as its first step does."""

    @torch.no_grad()
    def init_state(self) -> None:
        """The state the first step makes, now, for every parameter that trains."""
        for group in self.param_groups:
            for param in group["params"]:
                if param.requires_grad:
                    self._state(param, group)


class ShardLocalAdamW(FirstStepState, torch.optim.AdamW):
    """torch.optim.AdamW whose update runs on the parameters' local shards (see the module)."""

    def _state(self, param: torch.Tensor, group: dict) -> dict:
        state = self.state[param]
        if not state:  # torch's AdamW state: a float32 host step count, zero moments
            state["step"] = torch.tensor(0.0, dtype=torch.float64 if torch.get_default_dtype() == torch.float64
                                         else torch.float32)
            state["exp_avg"] = map_shards(param, _zeros)
            state["exp_avg_sq"] = map_shards(param, _zeros)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = map_shards(param, _zeros)
        return state

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        if closure is not None:
            raise ValueError("ShardLocalAdamW.step takes no closure")
        for group in self.param_groups:
            if group["fused"] or group["capturable"] or group["differentiable"]:
                raise ValueError("ShardLocalAdamW runs torch's foreach or per-tensor AdamW only "
                                 "(fused, capturable and differentiable are not supported)")
            rows, steps = [], []
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError("AdamW does not support sparse gradients")
                state = self._state(param, group)
                row = [param, param.grad, state["exp_avg"], state["exp_avg_sq"]]
                if group["amsgrad"]:
                    row.append(state["max_exp_avg_sq"])
                rows.append(row)
                steps.append(state["step"])
            if not rows:
                continue
            beta1, beta2 = group["betas"]
            for chunk, listwide in local_rows(rows, group["foreach"]):
                columns = [[rows[k][c] for k in chunk] for c in range(len(rows[0]))]
                adamw(columns[0], columns[1], columns[2], columns[3], columns[4] if group["amsgrad"] else [],
                      [steps[k] for k in chunk], foreach=listwide, has_complex=False,
                      amsgrad=group["amsgrad"], beta1=beta1, beta2=beta2, lr=group["lr"],
                      weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"])
        return None
