"""A training run's parallelisation and optimizer, from the config: made once here, for the
trainer and for `credit plan`, which traces the same model and step."""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from credit.parallel import parallelize_model
from credit.train.elementwise_adamw import ElementwiseAdamW
from credit.train.shard_local import ShardLocalAdamW


def build_optimizer(model: nn.Module, opt: DictConfig, deterministic: bool) -> torch.optim.Optimizer:
    """AdamW over `model`'s parameters: element by element in deterministic mode (bitwise in
    any layout), else each rank's shards at once (`credit.train.shard_local`)."""
    adamw = ElementwiseAdamW if deterministic else ShardLocalAdamW
    optimizer = adamw(model.parameters(), lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps,
                      weight_decay=opt.weight_decay)
    choose_foreach(model, optimizer)
    return optimizer


def choose_foreach(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Batch the optimizer update into a few calls (torch picks foreach on GPU only),
    except where DTensor's foreach ops refuse a mix of DTensors and plain tensors
    (tensor parallelism without data parallelism). Set per parameter group, and again
    after a resume, since optimizer state dicts carry the flag of the run that saved them."""
    kinds = {isinstance(p, DTensor) for p in model.parameters()}
    for group in optimizer.param_groups:
        group["foreach"] = len(kinds) == 1


def parallelize_for_training(model: nn.Module, mesh: DeviceMesh, cfg: DictConfig) -> nn.Module:
    """`parallelize_model` with `trainer.parallelism.*` and the model's own keys."""
    par = cfg.trainer.parallelism
    return parallelize_model(
        model,
        mesh,
        par.data,
        activation_checkpointing=par.activation_checkpointing,
        mixed_precision=par.mixed_precision,
        reshard_after_forward=par.reshard_after_forward,
        shard_granularity=par.shard_granularity,
        deterministic=cfg.model.gemm == "deterministic",
        spectral_norm_tp=cfg.model.spectral_norm_tp,
        sequence_parallel=par.sequence_parallel,
        sequence_regather=par.sequence_parallel_regather,
    )
