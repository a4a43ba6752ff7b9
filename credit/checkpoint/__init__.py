"""Sharded DCP checkpoints: atomic step directories, retention, and the training state they hold."""

from credit.checkpoint.manager import CheckpointManager, checkpoint_keys, load_checkpoint

__all__ = ["CheckpointManager", "checkpoint_keys", "load_checkpoint"]
