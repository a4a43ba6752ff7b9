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


class CosineRestarts:
    """CREDIT's `cosine-annealing-restarts` (its CosineAnnealingWarmupRestarts, stepped after
    every optimizer step) as a multiplier of its `max_lr`: step 0 at `min_lr`, then cycles of
    a linear warm-up from min to max and a cosine back; each cycle `cycle_mult` times the last's
    post-warm-up length, its peak `gamma` times the last's."""

    def __init__(self, first_cycle_steps: int, cycle_mult: float, min_lr_ratio: float, warmup_steps: int,
                 gamma: float) -> None:
        self.first_cycle_steps, self.cycle_mult, self.gamma = first_cycle_steps, cycle_mult, gamma
        self.min_lr_ratio, self.warmup_steps = min_lr_ratio, warmup_steps

    def __call__(self, step: int) -> float:
        low, warmup = self.min_lr_ratio, self.warmup_steps
        if step == 0:  # CREDIT sets min_lr when it builds the scheduler
            return low
        in_cycle, length, cycle = step, self.first_cycle_steps, 0
        while in_cycle >= length:
            in_cycle -= length
            cycle += 1
            length = int((length - warmup) * self.cycle_mult) + warmup
        peak = self.gamma ** cycle
        if in_cycle < warmup:
            return (peak - low) * in_cycle / warmup + low
        return low + (peak - low) * (1 + math.cos(math.pi * (in_cycle - warmup) / (length - warmup))) / 2


class EpochCosine:
    """CREDIT's `cosine-annealing` (torch's CosineAnnealingLR, stepped once per epoch):
    during epoch e the lr is min + (base - min)(1 + cos(pi e / t_max)) / 2."""

    def __init__(self, steps_per_epoch: int, t_max: int, min_lr_ratio: float) -> None:
        self.steps_per_epoch, self.t_max, self.min_lr_ratio = steps_per_epoch, t_max, min_lr_ratio

    def __call__(self, step: int) -> float:
        epoch = step // self.steps_per_epoch
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * (1 + math.cos(math.pi * epoch / self.t_max)) / 2


class EpochLambda:
    """CREDIT's `lambda` schedule: f(e) = e / 10 below 10, then 0.5(1 + cos(pi (e - 10) / 90)),
    stepped twice per epoch by CREDIT's trainer (at the epoch's start and after its
    validation), so epoch k trains at f(2k + 1)."""

    def __init__(self, steps_per_epoch: int) -> None:
        self.steps_per_epoch = steps_per_epoch

    def __call__(self, step: int) -> float:
        e = 2 * (step // self.steps_per_epoch) + 1
        return e / 10 if e < 10 else 0.5 * (1 + math.cos(math.pi * (e - 10) / 90))


def schedule_function(sched, max_steps: int, steps_per_epoch: int):
    """The multiplier of `trainer.scheduler` (a SchedulerConfig) for a run of `max_steps`
    optimizer steps, `steps_per_epoch` of them per pass over the training set."""
    if sched.type == "cosine_restarts":
        return CosineRestarts(sched.first_cycle_steps, sched.cycle_mult, sched.min_lr_ratio, sched.warmup_steps,
                              sched.gamma)
    if sched.type == "epoch_cosine":
        return EpochCosine(steps_per_epoch, sched.t_max_epochs, sched.min_lr_ratio)
    if sched.type == "epoch_lambda":
        return EpochLambda(steps_per_epoch)
    return WarmupCosine(sched.warmup_steps, sched.total_steps or max_steps, sched.min_lr_ratio,
                        sched.warmup_from_zero)


def lambda_schedule(optimizer: torch.optim.Optimizer, multiplier, step: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """`multiplier` positioned at optimizer step `step` (a resume: each group's `initial_lr`
    is its base learning rate; the lr is set to base x multiplier(step), the same value an
    uninterrupted run reaches)."""
    if step:
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
    return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier, last_epoch=step - 1)


def warmup_cosine(
    optimizer: torch.optim.Optimizer, warmup_steps: int, max_steps: int, min_lr_ratio: float,
    step: int = 0, from_zero: bool = False,
) -> torch.optim.lr_scheduler.LambdaLR:
    """The warm-up cosine schedule positioned at optimizer step `step` (`lambda_schedule`)."""
    return lambda_schedule(optimizer, WarmupCosine(warmup_steps, max_steps, min_lr_ratio, from_zero), step)
