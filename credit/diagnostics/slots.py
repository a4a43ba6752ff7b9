"""A checked step's checksums as one int64 vector, laid out once at setup.

Every rank reserves the same slots in the same order, so one all-gather of the vector
carries a whole step's checks and a rank's slot means the same thing on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class SlotTable:
    def __init__(self) -> None:
        self.size = 0

    def reserve(self, width: int) -> slice:
        start, self.size = self.size, self.size + width
        return slice(start, self.size)

    def new_buffer(self, device: torch.device) -> torch.Tensor:
        return torch.zeros(self.size, dtype=torch.int64, device=device)


@dataclass
class Injection:
    """`diagnostics.sdc.inject`: fires once, the first time its step runs (a rollback that
    replays the step does not fault again, as a transient fault would not)."""

    kind: str
    layer: str
    rank: int
    step: int
    bit: int
    index: int
    fired: bool = False

    def due(self, kind: str, layer: str, rank: int, step: int) -> bool:
        hit = (not self.fired and kind == self.kind and layer == self.layer and rank == self.rank
               and step == self.step)
        if hit:
            self.fired = True
        return hit
