"""Comparisons against the outputs of CREDIT's own code (tests/fixtures/credit_reference,
tests/fixtures/credit_postblocks), shared by the one-process and the multi-rank tests."""

from __future__ import annotations

import torch


def physical_difference(model: torch.nn.Module, ours: torch.Tensor, credit: torch.Tensor) -> float:
    """The largest per-channel |ours - CREDIT| / max |CREDIT| of two normalised forecasts
    of a model with post blocks (`model.post_blocks`), in physical units."""
    fixer = model.post_blocks.fixers[0]
    ours, credit = ours * fixer.std + fixer.mean, credit * fixer.std + fixer.mean
    per_channel = (ours - credit).abs().amax(dim=(0, 2, 3, 4)) / credit.abs().amax(dim=(0, 2, 3, 4))
    return per_channel.max().item()
