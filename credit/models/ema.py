"""Exponential moving average of the weights, sharded exactly like the weights.

The shadow copies are clones of the live parameters, so under tensor parallelism or
FSDP2 they are DTensors with the same placements: each rank keeps only its shard, the
update is local, and DCP saves and reshards them like the model. Training updates it;
checkpoints save and restore it; rollout copies it into the model to forecast with it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from credit.parallel.local_shards import map_shards


def _by_device(shadows: list[torch.Tensor], params: list[torch.Tensor]) -> dict:
    groups: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for shadow, param in zip(shadows, params):
        groups.setdefault(shadow.device, []).append((shadow, param))
    return groups


class EMA:
    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay  # validated in (0, 1) with the config
        self.shadow = {name: map_shards(p.detach(), torch.clone) for name, p in model.named_parameters()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        # shadow += (param - shadow) * (1 - decay) in three single-rounding ops, not lerp_:
        # lerp's vector loop fuses a multiply-add its scalar tail does not, and sharding moves
        # elements between the two (deterministic mode needs the same bits in every layout).
        # A shadow placed like its parameter is updated on the local values, as DTensor's
        # elementwise ops would, without three dispatches per parameter and step.
        shadows, params = [], []
        for name, param in model.named_parameters():
            shadow, param = self.shadow[name], param.detach()
            if isinstance(shadow, DTensor) and isinstance(param, DTensor) and \
                    (shadow.device_mesh, shadow.placements) == (param.device_mesh, param.placements):
                shadow, param = shadow.to_local(), param.to_local()
            if isinstance(shadow, DTensor) or isinstance(param, DTensor):
                shadow.add_((param - shadow) * (1.0 - self.decay))
                continue
            shadows.append(shadow)
            params.append(param)
        for device, group in _by_device(shadows, params).items():
            differences = torch._foreach_sub([p for _, p in group], [s for s, _ in group])
            torch._foreach_mul_(differences, 1.0 - self.decay)
            torch._foreach_add_([s for s, _ in group], differences)

    @torch.no_grad()
    def reset_to(self, model: nn.Module) -> None:
        """Restart the averages from the model's current weights (e.g. weights just loaded)."""
        for name, param in model.named_parameters():
            self.shadow[name].copy_(param)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.shadow

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        """Overwrite the model's weights with the averages (e.g. for evaluation or export)."""
        for name, param in model.named_parameters():
            param.copy_(self.shadow[name])
