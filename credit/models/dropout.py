"""Dropout whose mask is a function of (seed, step, layer, global element index).

Deterministic mode (`model.gemm=deterministic`) needs the serial run and every (dp, tp)
layout to drop the same elements. A mask drawn from a generator cannot give that: the
draws depend on the local shape and on what was drawn before. Here each element's keep
decision is a counter-based hash of a per-step key and the element's position in the
*global* tensor: splitmix64's finaliser of its global row (sample and position within the
sample) and of its global column, combined per element by one more multiply-xorshift
round, so a tp rank holding columns 64..127 and a dp rank holding samples 4..7 draw
exactly what the serial run draws there. Hand-written because torch offers no counter-based random op on CPU.

The trainer sets the step context (`dropout_step`) before each forward; outside it
(inference, evaluation) the modules are identities unless training, and training without
a context is an error rather than a silent mask from nowhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MUL1 = _signed(0xBF58476D1CE4E5B9)
_MUL2 = _signed(0x94D049BB133111EB)
_COLUMN_SALT = _signed(0xD1B54A32D192ED03)  # column hashes differ from row hashes of the same index
_CHUNK = 1 << 16  # elements per pass of the per-element round


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's `>>` is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (wrapping arithmetic): a bijective hash."""
    z = z + _GOLDEN
    z = (z ^ _shift_right(z, 30)) * _MUL1
    z = (z ^ _shift_right(z, 27)) * _MUL2
    return z ^ _shift_right(z, 31)


def _mix_int(value: int) -> int:
    return int(mix64(torch.tensor([_signed(value)], dtype=torch.int64))[0])


@dataclass(frozen=True)
class MemberBlock:
    """A rank's share of each sample's ensemble members when they are spread over ranks
    (`trainer.parallelism.ensemble`): members `offset .. offset + here - 1` of `members`."""

    members: int
    here: int
    offset: int


@dataclass(frozen=True)
class DropoutStep:
    """What a training step's masks depend on besides the element index."""

    seed: int
    step: int
    sample_offset: int  # global index of this rank's first sample (an ensemble's: first row)
    local_batch: int  # samples this rank holds in the current forward (an ensemble's: rows)
    # members spread over ranks: this rank's rows are member block `members` of each of its
    # samples, so its rows are not one contiguous run of the global batch
    members: MemberBlock | None = None
    # forwards of a noise-injecting model so far in this context (an autoregressive forecast's
    # steps draw their own noise: credit.models.noise)
    forwards: list[int] = field(default_factory=lambda: [0], compare=False)


_current: DropoutStep | None = None


def current_step() -> DropoutStep | None:
    """The step context `dropout_step` set, or None outside one."""
    return _current


@contextlib.contextmanager
def dropout_step(seed: int, step: int, sample_offset: int, local_batch: int,
                 members: MemberBlock | None = None) -> Iterator[None]:
    """Masks drawn inside this block are those of (seed, step) for samples
    `sample_offset .. sample_offset + local_batch - 1` of the global batch; with `members`,
    the rows of member block `members` of the samples from the one whose first row is
    `sample_offset` (rows `local_batch`, `members.here` a sample)."""
    global _current
    previous, _current = _current, DropoutStep(seed, step, sample_offset, local_batch, members)
    try:
        yield
    finally:
        _current = previous


def global_rows(ctx: DropoutStep, rows: int, device: torch.device | str) -> torch.Tensor:
    """(rows,) int64 global row indices of a local tensor's `rows` flattened leading rows
    (each of the context's `local_batch` batch rows spanning rows / local_batch of them)."""
    if rows % ctx.local_batch:
        raise ValueError(f"input rows {rows} do not split into {ctx.local_batch} samples")
    per = rows // ctx.local_batch
    if ctx.members is None:
        first = ctx.sample_offset * per
        return torch.arange(first, first + rows, dtype=torch.int64, device=device)
    block = ctx.members
    local = torch.arange(ctx.local_batch, dtype=torch.int64, device=device)
    batch_row = ctx.sample_offset + (local // block.here) * block.members + block.offset + local % block.here
    return (batch_row[:, None] * per + torch.arange(per, dtype=torch.int64, device=device)).reshape(-1)


def keep_mask(shape: tuple[int, ...], p: float, layer: int, *, col_offset: int = 0,
              global_cols: int | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
    """Boolean keep mask for a local tensor of `shape` (samples outermost, columns last).

    The tensor is this rank's block of a global one: rows (all but the last dim, flattened)
    start at sample `sample_offset` of the step context, columns at `col_offset` of
    `global_cols` (default: the local width).
    """
    ctx = _current
    if ctx is None:
        raise RuntimeError("indexed dropout in training needs the step context "
                           "(credit.models.dropout.dropout_step); the trainer sets it")
    cols = shape[-1]
    global_cols = cols if global_cols is None else global_cols
    rows = 1
    for s in shape[:-1]:
        rows *= s
    key = _mix_int(_mix_int(_mix_int(ctx.seed) ^ ctx.step) ^ layer)
    # a full hash per global row and per global column, then one multiply-xorshift round per
    # element on their xor (cheaper than hashing every element's flat index)
    row_hash = mix64(global_rows(ctx, rows, device) ^ key)
    col_hash = mix64(torch.arange(col_offset, col_offset + cols, dtype=torch.int64, device=device) + _COLUMN_SALT)
    threshold = int(round(p * (1 << 24)))
    keep = torch.empty((rows, cols), dtype=torch.bool, device=device)
    step = max(1, _CHUNK // cols)  # row blocks with cache-sized int64 temporaries
    for start in range(0, rows, step):
        z = row_hash[start:start + step, None] ^ col_hash[None, :]
        z = (z ^ _shift_right(z, 32)) * _MUL1
        z = z ^ _shift_right(z, 29)
        torch.ge(_shift_right(z, 40), threshold, out=keep[start:start + step])  # top 24 bits
    return keep.view(shape)


class IndexedDropout(nn.Module):
    """`nn.Dropout` with masks from `keep_mask`; `layer` must be unique in the model."""

    def __init__(self, p: float, layer: int = 0) -> None:
        super().__init__()
        self.p = p
        self.layer = layer

    def forward(self, x: torch.Tensor, col_offset: int = 0, global_cols: int | None = None) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = keep_mask(tuple(x.shape), self.p, self.layer, col_offset=col_offset,
                         global_cols=global_cols, device=x.device)
        return x * keep.to(x.dtype) * (1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}, layer={self.layer}"
