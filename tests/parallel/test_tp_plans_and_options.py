"""Tensor-parallel plan errors, activation checkpointing, bf16 mixed precision, MPI launch env."""

import os

import pytest
import torch
from launcher import run_ranks
from test_distributed_training import _trainer
from tiny import tiny_overrides
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from credit.models.windowformer.model import Attention, FeedForward
from credit.parallel import apply_native_tensor_parallel, supports_native_tp
from credit.parallel.mesh import _adopt_mpi_environment


class _ConvPlan(nn.Module):
    _tp_plan = {"proj": "colwise"}

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(4, 4, 1)


def plan_errors():
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    cases = {
        "no_plan": nn.Sequential(nn.Linear(4, 4)),
        "conv": nn.Sequential(_ConvPlan()),
        "odd_width": nn.Sequential(FeedForward(dim=3, mult=1, dropout=0.0)),
        "odd_heads": nn.Sequential(Attention(dim=24, dim_head=8, window=2, kind="local", dropout=0.0)),
    }
    messages = {}
    for name, model in cases.items():
        try:
            apply_native_tensor_parallel(model, mesh)
            messages[name] = None
        except ValueError as error:
            messages[name] = str(error)
    ok = nn.Sequential(FeedForward(dim=4, mult=2, dropout=0.0), FeedForward(dim=4, mult=2, dropout=0.0))
    messages["sharded"] = apply_native_tensor_parallel(ok, mesh)
    return messages


def test_tp_plan_errors_are_clear():
    assert not supports_native_tp(nn.Linear(2, 2)) and supports_native_tp(FeedForward(4, 1, 0.0))
    messages = run_ranks(plan_errors, 2)[0]
    assert "declares no _tp_plan" in messages["no_plan"] and "tensor=2" in messages["no_plan"]
    assert "is a Conv2d; only nn.Linear" in messages["conv"]
    assert "out_features=3, not divisible by trainer.parallelism.tensor=2" in messages["odd_width"]
    assert "3 heads" in messages["odd_heads"] and "[1, 3]" in messages["odd_heads"]
    assert messages["sharded"] == 2


def losses_with(*runs):
    """Train each override list in turn (one process group, fresh trainers); their losses."""
    from credit.train.metrics import read_metrics

    losses = []
    for overrides in runs:
        trainer = _trainer(overrides)
        trainer.fit()
        losses.append([float(r["loss"]) for r in read_metrics(trainer.run_dir / "metrics.csv")])
    return losses


def test_activation_checkpointing_recomputes_the_same_losses_and_bf16_trains(tiny_data, tmp_path):
    # two steps: the second starts from the first update, so recomputed gradients are compared
    base = tiny_overrides(tiny_data, "parallelism=fsdp2_tp2", "trainer.max_steps=2",
                          "trainer.batch_size=2", "data.valid_samples=4")
    plain, recomputed, bf16 = run_ranks(
        losses_with, 4,
        [*base, f"run_dir={tmp_path / 'plain'}"],
        [*base, f"run_dir={tmp_path / 'ac'}", "trainer.parallelism.activation_checkpointing=true"],
        [*base, f"run_dir={tmp_path / 'bf16'}", "trainer.parallelism.mixed_precision=bf16"])[0]
    assert recomputed == plain
    assert all(torch.isfinite(torch.tensor(bf16)))
    assert bf16 != plain  # it really computed in bf16 ...
    assert bf16 == pytest.approx(plain, rel=0.05)  # ... and still learns the same problem


def test_mpiexec_ranks_are_adopted_and_a_missing_master_is_named():
    saved = dict(os.environ)  # adoption writes os.environ directly: restore all of it
    try:
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
            os.environ.pop(key, None)
        os.environ.update(OMPI_COMM_WORLD_RANK="3", OMPI_COMM_WORLD_SIZE="8",
                          OMPI_COMM_WORLD_LOCAL_RANK="1")
        with pytest.raises(RuntimeError, match="MASTER_ADDR"):
            _adopt_mpi_environment()
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        _adopt_mpi_environment()
        assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("3", "8", "1")
    finally:
        os.environ.clear()
        os.environ.update(saved)
