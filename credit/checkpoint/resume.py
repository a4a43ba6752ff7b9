"""Resuming: which checkpoint a run continues from, and putting it back into the run.

One home for the decision (`trainer.resume`: auto | never | a checkpoint directory | a
single-file checkpoint or weights-only directory), the loading (full training state, or
weights only), the EMA restart from loaded weights, the rescale of the sampler position
when the global batch changed, and the strict loading of forecast weights for rollout.
The trainer and rollout both come here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from credit.interop.training_state import load_credit_training_state
from credit.checkpoint.weights import load_model_weights
from credit.checkpoint.manager import CheckpointManager, checkpoint_problem, load_checkpoint
from credit.checkpoint.strict import check_stored_weights, check_weights, stored_shapes
from credit.checkpoint.training_state import Progress, restore_training_state
from credit.models.ema import EMA

log = logging.getLogger(__name__)


class RunDirHoldsRun(FileExistsError):
    """`trainer.resume=never` on a run directory that holds a run: rank 0's verdict, which
    every rank raises."""


def _decide(resume: str, run_dir: Path, checkpoints: CheckpointManager) -> tuple[str, str | None]:
    """("resume", path), ("fresh", None) or ("refuse", why), judged from the files."""
    latest = checkpoints.latest()
    if resume == "never":
        if latest is not None or (run_dir / "metrics.csv").exists():
            return "refuse", (
                f"run_dir {run_dir} already holds a run; trainer.resume=never would "
                f"overwrite it: use trainer.resume=auto to continue it or choose another run_dir"
            )
        return "fresh", None
    if resume == "auto":
        for path, problem in checkpoints.damaged_checkpoints():
            log.warning("trainer.resume=auto skips damaged checkpoint %s: %s", path, problem)
        return ("resume", str(latest)) if latest is not None else ("fresh", None)
    return "resume", resume


def resume_source(
    resume: str, run_dir: str | Path, checkpoints: CheckpointManager, is_main: bool
) -> Path | None:
    """The checkpoint `trainer.resume` names for this run, or None to start fresh.

    Rank 0 decides for every rank (a slower rank must not look at the run directory after
    rank 0 has started writing into it). Raises RunDirHoldsRun (a FileExistsError) for
    `never` on a run directory that already holds a run.
    """
    decision = [_decide(resume, Path(run_dir), checkpoints) if is_main else None]
    if dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(decision, src=0)
    verdict, detail = decision[0]
    if verdict == "refuse":
        raise RunDirHoldsRun(detail)
    return Path(detail) if verdict == "resume" else None


@dataclass
class ResumedRun:
    """What a training run needs to continue from a checkpoint."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    ema: EMA | None
    global_batch_size: int  # of this run: samples per step over all dp ranks
    batches_per_epoch: int  # of this run's sampler
    loss_state: dict[str, torch.Tensor] | None = None  # learned loss weights: loaded in place when stored


def resume_training(path: Path, run: ResumedRun) -> Progress:
    """Load `path` into the run's objects (any dp x tp layout); return where to continue.

    A single-file checkpoint or a weights-only directory loads model weights only: the run
    starts at step 0 with a fresh optimizer. A full checkpoint restores the optimizer,
    schedule, EMA and progress; the sampler position is converted when the global batch
    size differs from the one it was saved with. The EMA restarts from the loaded weights
    whenever the checkpoint holds none.
    """
    if load_model_weights(run.model, path):
        if run.ema is not None:
            run.ema.reset_to(run.model)
        log.warning(
            "loaded model weights only from %s: its optimizer state cannot be mapped, so "
            "the optimizer and scheduler start fresh at step 0", path,
        )
        return Progress(global_batch_size=run.global_batch_size)
    saved, ema_restored = restore_training_state(
        path, run.model, run.optimizer, run.scheduler, run.ema, run.loss_state
    )
    if run.ema is not None and not ema_restored:
        log.warning("checkpoint %s has no EMA weights; EMA restarts from the loaded weights", path)
        run.ema.reset_to(run.model)
    progress = saved.rescaled(run.global_batch_size, run.batches_per_epoch)
    if saved.global_batch_size not in (0, run.global_batch_size):
        log.warning(
            "resuming with %d samples per global batch instead of %d: the epoch continues "
            "from sample %d of its order", run.global_batch_size, saved.global_batch_size,
            progress.batch_in_epoch * run.global_batch_size,
        )
    log.info("resumed from %s at step %d", path, progress.step)
    return progress


def start_from_credit(path: str, with_optimizer: bool, reload_epoch: bool, run: ResumedRun,
                      fsdp: bool = False) -> Progress:
    """`trainer.credit_start`: CREDIT's checkpoint.pt (with `fsdp`, its fsdp mode's files beside
    it) into the run's objects (any layout); returns where to continue (step 0 unless
    `reload_epoch`; the caller positions the schedule there)."""
    start = load_credit_training_state(path, run.model, run.optimizer, with_optimizer, fsdp=fsdp)
    if run.ema is not None:
        run.ema.reset_to(run.model)
    what = "weights and AdamW state" if with_optimizer else "weights (fresh optimizer)"
    if not reload_epoch:
        log.info("started from CREDIT's checkpoint %s: its %s; step 0 (trainer.credit_start.reload_epoch=false)",
                 path, what)
        return Progress(global_batch_size=run.global_batch_size)
    step = start.steps
    progress = Progress(step, step // run.batches_per_epoch, step % run.batches_per_epoch, run.global_batch_size)
    log.info("continuing CREDIT's run from %s (its epoch %d done, %d optimizer steps): its %s; step %d",
             path, start.epoch, step, what, step)
    return progress


def find_checkpoint(choice: str, run_dir: str | Path) -> Path:
    """`auto`: the latest complete checkpoint in run_dir/checkpoints; otherwise the path given
    (`rollout.checkpoint`). Raises FileNotFoundError naming the key and the place looked in."""
    if choice == "auto":
        root = Path(run_dir) / "checkpoints"
        latest = CheckpointManager(root, keep_latest_k=1).latest()
        if latest is None:
            raise FileNotFoundError(
                f"rollout.checkpoint=auto found no complete checkpoint in {root}; train first "
                f"(credit train run_dir={run_dir}) or give rollout.checkpoint=PATH")
        return latest
    path = Path(choice)
    if not path.exists():
        raise FileNotFoundError(f"rollout.checkpoint={choice} does not exist")
    problem = checkpoint_problem(path)
    if problem is not None:
        raise FileNotFoundError(
            f"rollout.checkpoint={choice} is not a complete DCP checkpoint directory: {problem}")
    return path


@torch.no_grad()
def load_forecast_weights(model: nn.Module, path: Path, weights: str) -> None:
    """Load `path`'s model weights, and for `weights="ema"` its EMA averages over the
    parameters, into `model` (any dp x tp layout); strict: see `credit.checkpoint.strict`."""
    check_stored_weights(model, path)
    state = {"model": get_model_state_dict(model)}
    ema = None
    if weights == "ema":
        ema = EMA(model, decay=0.5)  # only its shadow is used: same names and placements
        check_weights({k: tuple(v.shape) for k, v in ema.shadow.items()},
                      stored_shapes(path, "ema"), f"{path} (ema weights)")
        state["ema"] = ema.state_dict()
    load_checkpoint(path, state)
    set_model_state_dict(model, state["model"])
    if ema is not None:
        ema.copy_to(model)
    log.info("loaded %s weights from %s", weights, path)
