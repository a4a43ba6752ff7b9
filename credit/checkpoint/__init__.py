"""Sharded DCP checkpoints: atomic step directories, retention, the training state they hold,
resuming (train and rollout), strict loading, and weights brought from single files."""

from credit.checkpoint.weights import convert_checkpoint
from credit.checkpoint.manager import CheckpointError, CheckpointManager, checkpoint_keys, load_checkpoint

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "checkpoint_keys",
    "convert_checkpoint",
    "load_checkpoint",
]
