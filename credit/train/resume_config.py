"""On resume the config wins: the optimizer's hyperparameters and the learning-rate schedule
come from `trainer.*`, not from the checkpoint (users extend and fine-tune runs this way)."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from credit.train.schedule import lambda_schedule, schedule_function


def apply_config_hyperparameters(optimizer: torch.optim.Optimizer, scheduler, trainer: DictConfig,
                                 batches_per_epoch: int, step: int) -> tuple[object, dict[str, tuple]]:
    """Set `trainer.optimizer`'s lr, betas, eps and weight decay on every parameter group and
    rebuild the schedule at `step`. Returns (the new scheduler, {config key: (checkpoint value,
    config value)} for every value that changed)."""
    opt, sched = trainer.optimizer, trainer.scheduler
    wanted = {"lr": opt.lr, "betas": tuple(opt.betas), "eps": opt.eps, "weight_decay": opt.weight_decay}
    changes: dict[str, tuple] = {}
    for group in optimizer.param_groups:
        for key, value in wanted.items():
            stored = group.get("initial_lr", group["lr"]) if key == "lr" else group[key]
            if (tuple(stored) if key == "betas" else stored) != value:
                changes[f"trainer.optimizer.{key}"] = (stored, value)
            group["initial_lr" if key == "lr" else key] = value
    saved = vars(scheduler.lr_lambdas[0])  # the schedule's parameters as saved
    schedule = schedule_function(sched, trainer.max_steps, batches_per_epoch)
    for name, now in vars(schedule).items():
        before = saved.get(name)
        if now != before:
            changes["trainer.max_steps" if name == "max_steps" else f"trainer.scheduler.{name}"] = (before, now)
    return lambda_schedule(optimizer, schedule, step=step), changes
