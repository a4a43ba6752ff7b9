"""The replica check: after the optimizer step, copies that must be equal are bitwise equal.

A parameter's local tensor must be identical on every rank whose mesh coordinates differ
only along mesh dimensions where the parameter is replicated: tp peers for tp-replicated
parameters (norms, row-parallel biases), dp peers under ddp, every rank for a plain
tensor. Its label is the mesh dimensions and coordinates it is not replicated along; ranks
with the same label form the group whose modal checksum is the reference.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from credit.diagnostics.checksum import bit_checksum
from credit.diagnostics.slots import SlotTable
from credit.diagnostics.verdict import Mismatch, disagreeing, layer_of


def replica_label(param: torch.Tensor) -> tuple:
    """The coordinates that tell this rank's copy apart; () for a tensor held whole everywhere."""
    if not isinstance(param, DTensor):
        return ()
    mesh = param.device_mesh
    names = mesh.mesh_dim_names or tuple(str(i) for i in range(mesh.ndim))
    coordinate = mesh.get_coordinate()
    return tuple((names[i], coordinate[i]) for i, placement in enumerate(param.placements)
                 if not placement.is_replicate())


class ReplicaCheck:
    check = "replica"

    def __init__(self, model: nn.Module, slots: SlotTable) -> None:
        self.params = list(model.named_parameters())
        self.spans = {name: slots.reserve(1) for name, _ in self.params}

    def metadata(self) -> dict[str, tuple]:
        return {name: replica_label(p) for name, p in self.params}

    @torch.no_grad()
    def record(self, buffer: torch.Tensor) -> None:
        for name, param in self.params:
            buffer[self.spans[name].start] = bit_checksum(param)

    @staticmethod
    def comparable(labels: list[dict[str, tuple]]) -> int:
        """How many parameters have a copy on more than one rank (0: nothing to check)."""
        count = 0
        for name in labels[0]:
            seen = [ranks[name] for ranks in labels]
            count += len(set(seen)) < len(seen)
        return count

    def verdict(self, step: int, rows: list[list[int]], labels: list[dict[str, tuple]]
                ) -> tuple[set[tuple[str, str]], list[Mismatch]]:
        verified, found = set(), []
        for name, span in self.spans.items():
            groups: dict[tuple, dict[int, int]] = {}
            for rank, values in enumerate(rows):
                groups.setdefault(labels[rank][name], {})[rank] = values[span.start]
            layer = layer_of(name)
            for members in groups.values():
                if len(members) < 2:
                    continue
                verified.add((layer, self.check))
                expected, bad, candidates = disagreeing(members)
                for rank in bad:
                    found.append(Mismatch(step, rank, layer, "state", self.check, name, expected,
                                          members[rank], sorted(members), candidates,
                                          "copies differ after the optimizer step"))
        return verified, found
