"""Gaussian-like noise whose every value is a function of (seed, step, forward, layer,
global row, element): the noise CREDIT's ensemble CrossFormer injects, placed so that a
member draws the same noise on any rank and in any layout.

CREDIT draws `torch.randn` from the device's generator, so a member's noise depends on which
rank runs it and on what that rank drew before. Here each value is hashed from its position
in the global batch (the step context of `credit.models.dropout`: its rows are an ensemble's
(sample, member) pairs) and its index within the sample, as the dropout masks are. Two
splitmix64 rounds per value give eight 16-bit uniforms whose sum, centred and scaled, has
mean 0 and variance 1 (an Irwin-Hall sum of 8: bell-shaped, within +-4.9). Integer arithmetic
up to one rounding into float, so every device and vector width gives the same bits, which a
transcendental Box-Muller on the CPU does not promise. Hand-written because torch has no
counter-based normal on the CPU.
"""

from __future__ import annotations

import math

import torch

from credit.models.dropout import _COLUMN_SALT, _mix_int, _shift_right, current_step, global_rows, mix64

_NOISE_SALT = 0x5EED_0F_E45E  # noise keys differ from dropout keys of the same layer number
_UNIFORMS = 8  # 16-bit uniforms summed per value (two 64-bit hashes)
_SCALE = 1.0 / (65536.0 * math.sqrt(_UNIFORMS / 12.0))
_MEAN = _UNIFORMS * 65535 / 2


def next_forward() -> int:
    """The index of this forward among the noise-injecting forwards of the step context
    (counted: an autoregressive forecast's steps draw their own noise)."""
    ctx = _context()
    index = ctx.forwards[0]
    ctx.forwards[0] += 1
    return index


def indexed_normal(shape: tuple[int, ...], layer: int, forward: int, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Noise of `shape` (rows first: this rank's rows of the step context, the rest one
    sample's elements) for `layer` in forward number `forward` of the step context."""
    ctx = _context()
    rows = shape[0]
    cols = math.prod(shape[1:])
    key = _mix_int(_mix_int(_mix_int(_mix_int(ctx.seed) ^ ctx.step) ^ forward) ^ layer ^ _NOISE_SALT)
    row_hash = mix64(global_rows(ctx, rows, device) ^ key)
    col_hash = mix64(torch.arange(cols, dtype=torch.int64, device=device) + _COLUMN_SALT)
    total = torch.zeros((rows, cols), dtype=torch.int64, device=device)
    z = row_hash[:, None] ^ col_hash[None, :]
    for _ in range(_UNIFORMS // 4):
        z = mix64(z)
        for part in range(4):
            total += (_shift_right(z, 16 * part) if part else z) & 0xFFFF
    return ((total.double() - _MEAN) * _SCALE).to(dtype).view(shape)


def _context():
    ctx = current_step()
    if ctx is None:
        raise RuntimeError("a noise-injecting model needs the step context (credit.models.dropout.dropout_step): "
                           "the trainer, validation and credit rollout set it")
    return ctx
