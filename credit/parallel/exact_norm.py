"""A global gradient norm whose bits do not depend on sharding or summation order.

Deterministic mode clips with it: a float sum of squares depends on the order of its terms
(float64 only makes a mismatch rare), and the clip factor then differs in its last bit
between layouts. Here each gradient element's square (exact in float64 for float32 and
bfloat16 gradients) is split into its binary exponent and two 26-bit halves of its
mantissa, and the halves are added as integers per exponent, which is exact in any order,
on any rank, in any collective. The per-exponent integer sums are then turned into one
float64 in a fixed order, identical on every rank and in every layout. Hand-written:
torch has no order-free reduction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate

_OFFSET = 1100  # float64 binary exponents of squares lie well inside [-1100, 1100)
_HALF = 26


def _bins(t: torch.Tensor) -> torch.Tensor:
    """(2, 2 * _OFFSET) int64: per exponent, summed high and low mantissa halves of t**2."""
    squares = t.detach().reshape(-1).to(torch.float64) ** 2
    mantissa, exponent = torch.frexp(squares)  # squares = mantissa * 2**exponent, mantissa in [0.5, 1)
    bits = (mantissa * 2.0**53).to(torch.int64)  # exact: 53 significant bits at most
    index = (exponent.to(torch.int64) + _OFFSET).cpu()
    bins = torch.zeros(2, 2 * _OFFSET, dtype=torch.int64)
    bins[0].index_add_(0, index, (bits >> _HALF).cpu())
    bins[1].index_add_(0, index, (bits & ((1 << _HALF) - 1)).cpu())
    return bins


def _key(grad: torch.Tensor) -> object:
    if not isinstance(grad, DTensor):
        return None
    # a dim shards unless it replicates (FSDP2 over tp uses _StridedShard, not a Shard subclass)
    return grad.device_mesh, tuple(not isinstance(p, Replicate) for p in grad.placements)


def exact_grad_norm(grads: Iterable[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all `grads` (plain tensors or DTensors on any meshes), float64, the
    same bits whatever the sharding. Replicated mesh dims count once."""
    per_key: dict[object, torch.Tensor] = {}
    for grad in grads:
        if grad is None:
            continue
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        key = _key(grad)
        per_key[key] = per_key.get(key, 0) + _bins(local)
    total = torch.zeros(2, 2 * _OFFSET, dtype=torch.int64)
    for key, bins in per_key.items():
        if key is not None:  # sum over the mesh dims that shard, once over replicated ones
            mesh, sharded = key
            placements = [Partial() if s else Replicate() for s in sharded]
            bins = DTensor.from_local(bins.to(mesh.device_type), mesh, placements).full_tensor().cpu()
        total += bins
    value = 0.0
    for i in (total[0] | total[1]).nonzero().flatten().tolist():  # fixed order: ascending exponents
        exponent = i - _OFFSET - 53
        value = value + math.ldexp(float(total[0, i]), exponent + _HALF) + math.ldexp(float(total[1, i]), exponent)
    return torch.tensor(value, dtype=torch.float64).sqrt()


@torch.no_grad()
def clip_grad_norm_exact_(parameters: Iterable[torch.Tensor], max_norm: float) -> float:
    """Scale gradients so their `exact_grad_norm` is at most `max_norm`; return the norm
    before. The factor is one float computed identically everywhere, each gradient element
    multiplied by it once."""
    params = [p for p in parameters if p.grad is not None]
    norm = float(exact_grad_norm([p.grad for p in params]))
    factor = max_norm / (norm + 1e-6)
    if factor < 1.0:
        for p in params:
            p.grad.mul_(factor)
    return norm
