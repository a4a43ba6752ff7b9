"""Activations for deterministic mode whose bits do not depend on where an element sits.

torch's CPU elementwise kernels run a vectorised loop over whole blocks of 2 x the vector
width and a scalar loop over the remainder, and for transcendental functions (erf, exp) the
two loops can round differently. An element's block or remainder then depends on the
tensor's size: a sample at the end of a 2-sample batch can land in the remainder, the same
sample in the middle of a 4-sample batch does not, and a tensor-parallel shard moves the
boundary again. Here a contiguous tensor whose size is a whole number of blocks runs as it
is (no remainder); any other is flattened and padded to whole blocks first, so every
element takes the vectorised path, in the forward and, through autograd, the backward.
On other devices every element runs the same code, and the op runs as it is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

# a multiple of 2 x the widest vector (AVX-512: 2 x 16 floats; bf16 and fp16: 2 x 32)
BLOCK = 64


def without_remainder(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """`fn(x)` for an elementwise `fn`, every element through torch's vectorised CPU loop."""
    n = x.numel()
    if x.device.type != "cpu" or (x.is_contiguous() and n % BLOCK == 0):
        return fn(x)
    flat = F.pad(x.reshape(-1), (0, -n % BLOCK))
    return fn(flat)[:n].view(x.shape)


class DetGELU(nn.GELU):
    """`nn.GELU` computed `without_remainder`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return without_remainder(super().forward, x)


class DetSiLU(nn.SiLU):
    """`nn.SiLU` computed `without_remainder`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return without_remainder(super().forward, x)


class DetSigmoid(nn.Sigmoid):
    """`nn.Sigmoid` computed `without_remainder`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return without_remainder(super().forward, x)


def sigmoid(x: torch.Tensor, deterministic: bool) -> torch.Tensor:
    """`torch.sigmoid`, `without_remainder` in deterministic mode."""
    return without_remainder(torch.sigmoid, x) if deterministic else torch.sigmoid(x)
