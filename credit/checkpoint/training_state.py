"""What a training checkpoint holds, and putting it back.

Keys: `model`, `optim` (sharded, from `get_state_dict`), `ema` (sharded like the model),
`loss` (learned loss weights and their optimizer's moments, plain tensors alike on every rank),
`scheduler`, `progress` (step, epoch, batch_in_epoch: the sampler position, and the global
batch size it counts in), `config` (the resolved YAML). Tensors stay DTensors; nothing is
gathered to rank 0. No RNG state is stored: training randomness is a function of (seed,
dp rank, step) (`credit.parallel.seeding`), so the step alone restores it. Checkpoints
written before that still hold `rng.rank*` keys, which are never read.
"""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from credit.checkpoint.manager import checkpoint_keys, load_checkpoint
from credit.checkpoint.strict import check_stored_weights
from credit.models.ema import EMA

log = logging.getLogger(__name__)


@dataclass
class Progress:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    global_batch_size: int = 0  # samples per sampler batch over all dp ranks, when saved

    def rescaled(self, global_batch_size: int, batches_per_epoch: int) -> "Progress":
        """The same position in the epoch's sample order for another global batch size
        (a resume under a different dp layout or batch size), rounded up to whole batches."""
        if self.global_batch_size in (0, global_batch_size):
            return Progress(self.step, self.epoch, self.batch_in_epoch, global_batch_size)
        consumed = self.batch_in_epoch * self.global_batch_size
        batch = -(-consumed // global_batch_size)
        epoch = self.epoch
        if batch >= batches_per_epoch:
            epoch, batch = epoch + 1, 0
        return Progress(self.step, epoch, batch, global_batch_size)


def training_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    ema: EMA | None,
    progress: Progress,
    config_yaml: str,
    loss_state: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    model_state, optim_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {
        "model": model_state,
        "optim": optim_state,
        "scheduler": {"state": pickle.dumps(scheduler.state_dict())},
        "progress": {
            "step": progress.step,
            "epoch": progress.epoch,
            "batch_in_epoch": progress.batch_in_epoch,
            "global_batch_size": progress.global_batch_size,
        },
        "config": config_yaml,
    }
    if ema is not None:
        state["ema"] = ema.state_dict()
    if loss_state is not None:
        state["loss"] = loss_state
    return state


def restore_training_state(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    ema: EMA | None,
    loss_state: dict[str, torch.Tensor] | None = None,
) -> tuple[Progress, bool]:
    """Load `path` (any dp x tp layout) into this run's objects, strictly; `loss_state`'s
    tensors are loaded in place when the checkpoint holds them (else left as they are).

    Returns where the run stopped, and whether the EMA was restored (False when the run
    has an EMA but the checkpoint holds none: the caller restarts it from the weights).
    """
    check_stored_weights(model, path)
    state = training_state(model, optimizer, scheduler, ema, Progress(), "", loss_state)
    stored = checkpoint_keys(path)
    ema_restored = ema is not None and any(k.startswith("ema.") for k in stored)
    if ema is not None and not ema_restored:
        state.pop("ema")
    if loss_state is not None and not any(k.startswith("loss.") for k in stored):
        log.warning("checkpoint %s holds no learned loss weights (trainer.loss.learnable_variance was off): "
                    "they start from their initial values", path)
        state.pop("loss")
    load_checkpoint(path, state)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    scheduler.load_state_dict(pickle.loads(state["scheduler"]["state"]))
    p = state["progress"]
    progress = Progress(
        int(p["step"]), int(p["epoch"]), int(p["batch_in_epoch"]), int(p["global_batch_size"])
    )
    return progress, ema_restored
