"""CREDIT's pointwise gen2 blocks: the preblocks `log_transform`, `sqrt_transform` and
`fill_values` that the data take before the scaler, and the postblocks `exp_transform` and
`square_transform` that undo the first two on the outputs after the inverse scaler. Each is
CREDIT's float arithmetic, done with the same torch operations in the tensor's dtype:

- log: `log_b(x + eps) - log_b(eps)` (base e, 2 or 10; eps 1e-8 by default), so 0 stays 0;
- exp: `b^(y + log_b(eps)) - eps`, its inverse;
- sqrt: `sqrt(x)`; square: `y^2`;
- fill: each rule's mask (NaN, or a comparison that NaN never meets) taken on the values as
  they come, then the fills applied in rule order (the last matching rule wins).

`data.credit.transforms` lists the preblocks in their config order (`CreditGen2Dataset` applies
them to each variable's values as read, before normalising), `data.credit.output_inverse` the
postblocks; `OutputInverse` applies the latter to de-normalised output channels (forecasts,
validation RMSE, physical-unit losses, climatology).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from credit.models.deterministic.pointwise import without_remainder

BASES = {"e": (math.log, torch.log, torch.exp), "2": (math.log2, torch.log2, torch.exp2),
         "10": (math.log10, torch.log10, lambda y: torch.pow(10.0, y))}
"""A log block's `base`: (Python's log for log_b(eps), torch's log, torch's exponential)."""

FORWARD_KINDS = ("log", "sqrt", "fill")
COMPARISONS = {"==": torch.eq, "!=": torch.ne, "<": torch.lt, "<=": torch.le, ">": torch.gt, ">=": torch.ge}
INVERSE_OF = {"log": "exp", "sqrt": "square"}


@dataclass(frozen=True)
class Pointwise:
    """One pointwise block: `kind` log, sqrt (preblocks) or exp, square (postblocks)."""

    kind: str
    base: str = "e"
    eps: float = 1e-8
    rules: tuple[tuple[float | None, str, float], ...] = ()  # fill: (search, None for NaN; op; fill)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "fill":
            masks = [(torch.isnan(x) if search is None else ~torch.isnan(x) & COMPARISONS[op](x, search), fill)
                     for search, op, fill in self.rules]
            for mask, fill in masks:
                x = torch.where(mask, torch.tensor(fill, dtype=x.dtype), x)
            return x
        if self.kind == "sqrt":
            return torch.sqrt(x)
        if self.kind == "square":
            return torch.square(x)
        log_eps = BASES[self.base][0](float(self.eps))
        if self.kind == "log":
            return BASES[self.base][1](x + float(self.eps)) - log_eps
        return BASES[self.base][2](x + log_eps) - float(self.eps)


def blocks(entries: Sequence[Mapping[str, Any]]) -> list[tuple[Pointwise, list[str]]]:
    """(block, the bare names of its variables) of `data.credit.transforms`/`output_inverse`."""
    return [(Pointwise(str(e["kind"]), str(e["base"]), float(e["eps"]),
                       tuple((None if r["search"] is None else float(r["search"]), str(r["op"]), float(r["fill"]))
                             for r in e.get("rules") or ())), list(e["variables"])) for e in entries]


class OutputInverse:
    """The postblocks' pointwise inverses on output channels: called with a (..., C, H, W)
    tensor of de-normalised outputs (the target channel order), it returns the channels each
    block names through that block, in order; other channels pass through. Autograd-safe."""

    def __init__(self, entries: Sequence[Mapping[str, Any]], channel_variables: Sequence[str]) -> None:
        self.steps = []
        for block, names in blocks(entries):
            rows = [i for i, v in enumerate(channel_variables) if v in names]
            if rows:
                self.steps.append((block, rows))

    def __bool__(self) -> bool:
        return bool(self.steps)

    def __call__(self, physical: torch.Tensor) -> torch.Tensor:
        out = physical
        for block, rows in self.steps:
            index = torch.tensor(rows, device=out.device)
            # every element through torch's vectorised CPU loop: bits that do not depend on the
            # batch or the layout (credit/models/deterministic/pointwise.py)
            out = out.index_copy(-3, index, without_remainder(block, out.index_select(-3, index)))
        return out
