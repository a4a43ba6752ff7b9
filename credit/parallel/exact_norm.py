"""A global gradient norm whose bits do not depend on sharding or summation order.

Deterministic mode clips with it: a float sum of squares depends on the order of its terms
(float64 only makes a mismatch rare), and the clip factor then differs in its last bit
between layouts. Here each gradient element, read as a float32 (exact for float32,
bfloat16 and float16 gradients), is its 24-bit integer significand m times a power of two
fixed by its 8-bit exponent field, so its square is m**2 (< 2**48) times a power of two
fixed by that field. m**2 is split into three integer products below 2**24 that are added
per exponent field (256 bins), exactly in any order, on any rank, in any collective;
the bins are combined into one Python integer and rounded to float64 once. Hand-written:
torch has no order-free reduction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate

from credit.kernels import elementwise
from credit.parallel.local_shards import local_values

_BINS = 256  # float32 exponent fields
_CHUNK = 1 << 18  # elements per pass of torch's ops: cache-sized temporaries
# m = hi * 2**12 + lo, so m**2 = hi**2 * 2**24 + 2 * hi * lo * 2**12 + lo**2: three products
# below 2**24 each, summed per bin
_WEIGHTS = (1 << 24, 2 << 12, 1)


def _int32(value: int) -> torch.Tensor:
    # a 0-dim int32 operand keeps torch on its vectorised int32 kernels (a Python int does not)
    return torch.tensor(value, dtype=torch.int32)


def _bins(tensors: list[torch.Tensor]) -> torch.Tensor:
    """(3, 256) int64 over every element of `tensors`: per float32 exponent field, the sums
    of hi**2, hi*lo and lo**2 over the elements' 24-bit significands m = hi * 2**12 + lo.
    Integer sums, so grouping the elements changes nothing: on the CPU one fused pass per
    tensor (`credit.kernels.elementwise`, no concatenated copy); elsewhere torch's ops over
    their concatenation, a few launches for the whole set."""
    flats = [t.detach().reshape(-1).to(torch.float32) for t in tensors]
    kernel = elementwise.fused(*flats)
    if kernel is None:
        return bins_torch(torch.cat(flats) if len(flats) > 1 else flats[0])
    return kernel.det_square_bins(flats)


def bins_torch(flat: torch.Tensor) -> torch.Tensor:
    """`_bins` of one flat float32 tensor with torch's ops, on its own device."""
    # integer index_add_: exact in any order of addition (a GPU's atomics included), allowed
    # by torch's deterministic-algorithms switch, and, unlike bincount, no host sync
    total = torch.zeros(len(_WEIGHTS), _BINS, dtype=torch.int64, device=flat.device)
    for part in flat.split(_CHUNK):
        bits = part.contiguous().view(torch.int32)
        field = torch.bitwise_and(torch.bitwise_right_shift(bits, _int32(23)), _int32(0xFF))
        significand = torch.bitwise_and(bits, _int32(0x7FFFFF))
        significand = torch.where(field > 0, torch.bitwise_or(significand, _int32(0x800000)), significand)
        hi = torch.bitwise_right_shift(significand, _int32(12))
        lo = torch.bitwise_and(significand, _int32(0xFFF))
        products = torch.stack((hi * hi, hi * lo, lo * lo)).to(torch.int64)  # each < 2**24
        total.index_add_(1, field, products)
    return total


def _key(grad: torch.Tensor) -> object:
    if not isinstance(grad, DTensor):
        return None
    # a dim shards unless it replicates (FSDP2 over tp uses _StridedShard, not a Shard subclass)
    return grad.device_mesh, tuple(not isinstance(p, Replicate) for p in grad.placements)


def exact_grad_norm(grads: Iterable[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all `grads` (plain tensors or DTensors on any meshes), float64, the
    same bits whatever the sharding. Replicated mesh dims count once."""
    per_key: dict[object, list[torch.Tensor]] = {}
    for grad in grads:
        if grad is None:
            continue
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        per_key.setdefault(_key(grad), []).append(local.detach().reshape(-1))
    total = torch.zeros(len(_WEIGHTS), _BINS, dtype=torch.int64)
    for key, locals_ in per_key.items():
        bins = _bins(locals_)
        if key is not None:  # sum over the mesh dims that shard, once over replicated ones
            mesh, sharded = key
            placements = [Partial() if s else Replicate() for s in sharded]
            bins = DTensor.from_local(bins.to(mesh.device_type), mesh, placements).full_tensor()
        total += bins.cpu()
    # sum of m**2 * 2**(2 * (max(field, 1) - 150)), exact as a Python integer scaled by 2**298
    if total[:, _BINS - 1].any():  # inf or nan in a gradient
        return torch.tensor(math.inf, dtype=torch.float64)
    exact = 0
    for field in total.any(0).nonzero().flatten().tolist():  # fields in ascending order
        squares = sum(weight * int(total[row, field]) for row, weight in enumerate(_WEIGHTS))
        exact += squares << (2 * (max(field, 1) - 1))
    value = math.ldexp(float(exact), -298)  # one correctly rounded conversion
    return torch.tensor(value, dtype=torch.float64).sqrt()


@torch.no_grad()
def clip_grad_norm_exact_(parameters: Iterable[torch.Tensor], max_norm: float,
                          dynamic_scale: float | None = None) -> float:
    """Scale gradients so their `exact_grad_norm` is at most `max_norm` (with `dynamic_scale`
    s: sqrt(s x the norm)); return the norm before. The factor is one float computed
    identically everywhere, each gradient element multiplied by it once."""
    params = [p for p in parameters if p.grad is not None]
    norm = float(exact_grad_norm([p.grad for p in params]))
    if dynamic_scale is not None:
        max_norm = math.sqrt(dynamic_scale * norm)
    factor = max_norm / (norm + 1e-6)
    if factor < 1.0:
        for p in params:
            local_values(p.grad).mul_(factor)  # DTensor's multiply by a scalar, on each shard
    return norm
