"""What a training checkpoint holds, and putting it back.

Keys: `model`, `optim` (sharded, from `get_state_dict`), `ema` (sharded like the model),
`scheduler`, `progress` (step, epoch, batch_in_epoch: the sampler position), `rng`
(one entry per rank), `config` (the resolved YAML). Tensors stay DTensors; nothing is
gathered to rank 0.
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
from credit.train.ema import EMA
from credit.train.runtime import rng_state, set_rng_state

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
    rank: int,
    config_yaml: str,
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
        # per-rank keys: DCP keeps a single copy of a value every rank stores under one key
        "rng": {f"rank{rank}": pickle.dumps(rng_state())},
        "config": config_yaml,
    }
    if ema is not None:
        state["ema"] = ema.state_dict()
    return state


def restore_training_state(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    ema: EMA | None,
    rank: int,
) -> Progress:
    """Load `path` (any dp x tp layout) into this run's objects; return where it stopped."""
    state = training_state(model, optimizer, scheduler, ema, Progress(), rank, "")
    stored = checkpoint_keys(path)
    if f"rng.rank{rank}" not in stored:
        state.pop("rng")  # saved under another layout: this rank keeps its fresh runtime seed
    if ema is not None and not any(k.startswith("ema.") for k in stored):
        state.pop("ema")
        log.warning("checkpoint %s has no EMA weights; EMA restarts from the loaded weights", path)
        ema_from_model = True
    else:
        ema_from_model = False
    load_checkpoint(path, state)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    scheduler.load_state_dict(pickle.loads(state["scheduler"]["state"]))
    if "rng" in state:
        set_rng_state(pickle.loads(state["rng"][f"rank{rank}"]))
    if ema is not None and ema_from_model:
        with torch.no_grad():
            for name, param in model.named_parameters():
                ema.shadow[name].copy_(param)
    p = state["progress"]
    return Progress(
        int(p["step"]), int(p["epoch"]), int(p["batch_in_epoch"]), int(p["global_batch_size"])
    )
