"""One training step of a model with indexed dropout on, for the tensor-parallel bitwise
tests: the loss and output it gives, and a full tensor of any (possibly sharded) one."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from credit.models.dropout import dropout_step


def step_with_dropout(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward with dropout at (seed 7, step 3), mean-square loss, backward: (loss, output)."""
    with dropout_step(seed=7, step=3, sample_offset=0, local_batch=x.shape[0]):
        y = model(x)
    loss = y.square().mean()
    loss.backward()
    return loss.detach(), y.detach()


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t
