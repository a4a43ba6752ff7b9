"""The arithmetic of one optimizer step, shared by the trainer and `credit plan` (which
traces it under fake tensors to estimate a layout's memory and communication)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from credit.kernels.gemm._tree import tree_sum
from credit.models.spectral_norm import defer_spectral_norm_backward, finish_spectral_norm_gradients
from credit.parallel import clip_grad_norm_, sync_replicated_gradients
from credit.parallel.exact_norm import clip_grad_norm_exact_
from credit.parallel.mesh import replica_mesh
from credit.parallel.tree_reduce import tree_all_reduce_gradients
from credit.train.deterministic import forecast_sample_sums, global_loss
from credit.train.forecast import forecast_loss
from credit.train.losses import WeightedLoss


def backward_micro_batch(model: nn.Module, batch: dict[str, torch.Tensor], loss_fn: WeightedLoss, *,
                         accum: int, deterministic: bool, step_samples: int,
                         forecast_steps: str = "mean", ensemble_ranks: int = 1) -> tuple[torch.Tensor, float | None]:
    """Forward and backward of one micro-batch. Returns (what the step's loss combines, the
    backward seed): the micro-batch's mean loss and None, or in deterministic mode its
    per-sample sums and the seed 1 / (`step_samples` x elements x forecast steps), the
    same constant in every layout (`step_samples`: every sample of the optimizer step,
    over micro-batches and dp replicas; no averaging over dp afterwards).
    `ensemble_ranks` E > 1: a sample's members are spread over E ranks, each holding the
    gradient of its own; the fast reduction averages over dp x E replicas where the members'
    gradients must add, so the seed is E times larger (a power of two: exact)."""
    if not deterministic:
        loss = forecast_loss(model, batch, loss_fn, forecast_steps)
        (loss * ensemble_ranks / accum).backward()
        return loss.detach(), None
    defer_spectral_norm_backward(model)  # finished once G is summed (update_parameters)
    sums = forecast_sample_sums(model, batch, loss_fn.sample_sums)
    target = batch["target"]
    steps = target.shape[1] if forecast_steps == "mean" else 1  # `sum`: the steps' losses added
    scale = 1.0 / (step_samples * loss_fn.elements(target[0, 0]) * steps)
    (tree_sum(list(sums.unbind(0))) * scale).backward()
    return sums.detach(), scale


def dynamic_clip_scale(dp_size: int, deterministic: bool) -> float:
    """s in CREDIT's `grad_max_norm: dynamic` limit sqrt(s x the norm): its number of
    data-parallel ranks; in deterministic mode 1 (CREDIT's one-process value) at every
    layout, since there the layout changes no bit (the one deviation from CREDIT's arithmetic)."""
    return 1.0 if deterministic else float(dp_size)


def update_parameters(model: nn.Module, optimizer: torch.optim.Optimizer, mesh: DeviceMesh | None, *,
                      deterministic: bool, data: str, grad_clip: float,
                      dynamic_scale: float | None = None) -> torch.Tensor | float:
    """After backward: synchronise gradients (the rank-order tree over dp, or dp x ens, for
    deterministic ddp; the tp replicas), clip them (`grad_clip` <= 0: no clipping; `dynamic_scale` s: to
    sqrt(s x the norm)) and step the optimizer. Returns the global gradient norm before clipping."""
    if mesh is not None:
        if deterministic and data == "ddp":
            tree_all_reduce_gradients(list(model.parameters()), replica_mesh(mesh).get_group())
        sync_replicated_gradients(model, mesh["tp"])
    if deterministic:
        finish_spectral_norm_gradients(model)
    max_norm = grad_clip if grad_clip > 0 else math.inf
    if deterministic:
        grad_norm = clip_grad_norm_exact_(model.parameters(), max_norm, dynamic_scale)
    else:
        grad_norm = clip_grad_norm_(model.parameters(), max_norm, dynamic_scale=dynamic_scale)
    optimizer.step()
    return grad_norm


def step_loss(losses: list[torch.Tensor], loss_scale: float | None, mesh: DeviceMesh | None, deterministic: bool,
              device: torch.device) -> float:
    """The step's loss, the same on every rank: the mean over micro-batches and dp replicas,
    or in deterministic mode the tree over every sample of the step (`loss_scale`: the
    backward seed `backward_micro_batch` returned)."""
    dp_group = mesh["dp"].get_group() if mesh is not None else None
    if deterministic:
        return global_loss(losses, loss_scale, dp_group)
    value = 0.0
    for loss in losses:
        value += float(loss) / len(losses)
    if mesh is None or mesh["dp"].size() == 1:
        return value
    total = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(total, group=dp_group)
    return float(total) / mesh["dp"].size()
