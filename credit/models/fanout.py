"""One tensor used by several layers, with its gradients added in a fixed order.

When a tensor feeds several layers, autograd adds their input gradients in the order it
happens to run their backward nodes, and that order changes with hooks the parallel
wrappers register (FSDP2's pre/post-backward hooks reorder it). Two terms add the same way
in either order; three do not: (a + b) + c != (a + c) + b in floating point. Deterministic
mode routes every fan-out of three or more uses through `fan_out`, whose backward adds the
gradients left to right in the order of the uses.
"""

from __future__ import annotations

import torch


class _FanOut(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n):  # type: ignore[override]
        return tuple(x.view_as(x) for _ in range(n))

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        total = None
        for g in grads:
            if g is not None:
                total = g if total is None else total + g
        return total, None


def fan_out(x: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
    """`n` aliases of `x`; the gradient of `x` is the sum of theirs, first use first."""
    return _FanOut.apply(x, n)
