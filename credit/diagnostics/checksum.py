"""Checksums of raw bits, and the bit flip that fault injection uses.

A tensor's checksum is the integer sum of its elements' raw bits viewed as the integer type
of the same width (int32 for fp32, int16 for bf16 and fp16), accumulated in int64: every
bit pattern counts, NaN and denormals included, and no float rounding can hide a change.
Checksums stay on the tensor's device; the detector concatenates a step's checksums and
compares them in one collective.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

_SAME_WIDTH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: a DTensor's local shard, a plain tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def raw_bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as same-width integers (a view, no copy when contiguous)."""
    flat = local(tensor).detach().contiguous().reshape(-1)
    return flat.view(_SAME_WIDTH_INT[flat.element_size()])


def bit_checksum(tensor: torch.Tensor) -> torch.Tensor:
    """0-d int64 on the tensor's device: the sum of its raw bits."""
    return raw_bits(tensor).sum(dtype=torch.int64)


def chunk_checksums(tensor: torch.Tensor, chunks: int) -> torch.Tensor:
    """(chunks,) int64: the checksums of `torch.chunk(tensor, chunks, dim=0)`'s pieces,
    padded with 0 where the tensor has fewer rows than chunks (FSDP2's dim-0 shards)."""
    rows = local(tensor).detach()
    rows = rows.reshape(rows.shape[0], -1) if rows.dim() else rows.reshape(1, 1)
    per_row = raw_bits(rows).view(rows.shape[0], -1).sum(dim=1, dtype=torch.int64)
    size = -(-rows.shape[0] // chunks)
    padded = torch.zeros(size * chunks, dtype=torch.int64, device=per_row.device)
    padded[: per_row.numel()] = per_row
    return padded.view(chunks, size).sum(dim=1)


def flip_bit(tensor: torch.Tensor, index: int, bit: int) -> None:
    """Flip bit `bit` of element `index` (flat, of the local tensor) in place."""
    target = local(tensor).detach()
    if not target.is_contiguous():
        raise ValueError("fault injection needs a contiguous tensor")
    bits = target.reshape(-1).view(_SAME_WIDTH_INT[target.element_size()])
    width = 8 * target.element_size()
    if not 0 <= bit < width:
        raise ValueError(f"diagnostics.sdc.inject.bit={bit} is outside a {width}-bit "
                         f"{target.dtype} element (allowed: 0..{width - 1})")
    if not 0 <= index < bits.numel():
        raise ValueError(f"diagnostics.sdc.inject.index={index} is outside the tensor's "
                         f"{bits.numel()} elements")
    mask = torch.tensor(1 << bit if bit < width - 1 else -(1 << bit), dtype=bits.dtype)
    bits[index] ^= mask.to(bits.device)
