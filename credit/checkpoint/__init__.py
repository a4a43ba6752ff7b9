"""Sharded DCP checkpoints: atomic step directories, retention, and the training state they hold."""

from credit.checkpoint.legacy import LegacyCheckpointError, convert_checkpoint
from credit.checkpoint.manager import CheckpointManager, checkpoint_keys, load_checkpoint

__all__ = [
    "CheckpointManager",
    "LegacyCheckpointError",
    "checkpoint_keys",
    "convert_checkpoint",
    "load_checkpoint",
]
