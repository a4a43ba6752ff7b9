"""Training: the loop, losses, schedules, metrics, validation."""

from credit.train.run import run_training

__all__ = ["run_training"]
