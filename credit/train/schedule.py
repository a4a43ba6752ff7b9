"""Learning-rate schedule: linear warm-up, then cosine decay to a floor."""

from __future__ import annotations

import math

import torch


class WarmupCosine:
    """Multiplier of the base learning rate at optimizer step `step` (0-based).

    A picklable callable (not a lambda) so the scheduler's state is plain data.
    """

    def __init__(self, warmup_steps: int, max_steps: int, min_lr_ratio: float, from_zero: bool = False) -> None:
        self.warmup_steps = warmup_steps
        self.max_steps = max_steps
        self.min_lr_ratio = min_lr_ratio
        # CREDIT's linear-warmup-cosine: step 0 at lr 0, base lr x step / warmup_steps
        self.from_zero = from_zero

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / self.warmup_steps if self.from_zero else (step + 1) / self.warmup_steps
        span = max(1, self.max_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine


def warmup_cosine(
    optimizer: torch.optim.Optimizer, warmup_steps: int, max_steps: int, min_lr_ratio: float,
    step: int = 0, from_zero: bool = False,
) -> torch.optim.lr_scheduler.LambdaLR:
    """The schedule positioned at optimizer step `step` (a resume: each group's `initial_lr`
    is its base learning rate; the lr is set to base x multiplier(step), the same value an
    uninterrupted run reaches)."""
    if step:
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, WarmupCosine(warmup_steps, max_steps, min_lr_ratio, from_zero), last_epoch=step - 1
    )
