"""One training step of one layout, traced on one process standing for one rank of N.

torch's fake process group (backend "fake") answers every collective at once, and
FakeTensorMode gives tensors shapes, dtypes and devices but no memory. The model is built on
the meta device, parallelised exactly as `credit train` does it (`parallelize_for_training`),
made fake (`to_empty`), and one step of the trainer's own arithmetic (`credit.train.step`)
runs under `StorageBytes` (the bytes of live tensor storage: what is held between steps, and
the peak) and `CommVolume` (DTensor's comm-debug mode with the bytes sent per process group).

The traced rank is the last: its tensor-parallel coordinate is the last, which holds the
leftover row when sequence parallelism splits an odd number of rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore  # importing it registers backend "fake"

from credit.config import ConfigError
from credit.models import EMA, advance_spectral_norm, build_model
from credit.parallel.mesh import all_ranks_mesh, build_device_mesh, replica_mesh, resolve_layout
from credit.plan.comm import CommVolume
from credit.plan.memory import StorageBytes
from credit.plan.shapes import SampleShapes
from credit.models.dropout import MemberBlock, dropout_step
from credit.train.ensemble import MembersGathered, with_members
from credit.train.losses import WeightedLoss
from credit.train.setup import build_optimizer, parallelize_for_training
from credit.train.step import backward_micro_batch, update_parameters


@dataclass
class StepTrace:
    """What one rank holds and sends in a training step (bytes)."""

    params: int  # this rank's parameters (its shards)
    grads: int
    optimizer: int
    held: int  # held when a step starts, gradients freed: parameters, optimizer state, buffers, EMA
    peak: int  # the most held at once during the step
    sent: dict[str, float] = field(default_factory=dict)  # per process group: "tp", "dp", "dp×tp"
    collectives: dict[str, int] = field(default_factory=dict)

    @property
    def activation(self) -> int:
        """The step's own memory: activations, gradients, gathered parameters, temporaries."""
        return self.peak - self.held


@contextmanager
def fake_process_group(world: int) -> Iterator[None]:
    """The last rank of a fake group of `world` ranks (nothing when `world` is 1)."""
    if dist.is_initialized():
        raise RuntimeError("credit plan runs in one process, outside any process group (not under torchrun)")
    if world == 1:
        yield
        return
    dist.init_process_group("fake", rank=world - 1, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()
        _forget_sharding_propagation()


def _forget_sharding_propagation() -> None:
    """Empty DTensor's sharding-propagation caches (torch's Python and C++ ones). Their keys
    compare meshes by ranks and dimension names, not by process group, and their cached
    output specs hold the mesh of the trace that filled them: a later trace whose groups are
    numbered otherwise (another mesh shape, e.g. one with an ensemble axis) would get DTensors
    on the destroyed groups of an earlier one."""
    from torch.distributed.tensor import DTensor

    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    clear_native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_native is not None:
        clear_native()


def check_traceable(cfg: DictConfig) -> None:
    """ConfigError for what a fake trace cannot run."""
    if cfg.model.gemm == "deterministic":
        raise ConfigError("credit plan traces model.gemm=fast: deterministic mode's exact gradient norm "
                          "reads values, which a fake trace has not (plan with model.gemm=fast; the "
                          "layouts' memory is alike)")


@torch.no_grad()  # DTensor.to_local is then a plain attribute read, not an autograd function
def shard_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of this rank's parameters, gradients and optimizer state (a DTensor counts its
    local shard): what `credit plan` reports, and what the benchmarks measure alike."""
    def local(tensors) -> int:
        return sum((t.to_local() if isinstance(t, DTensor) else t).numel() * t.element_size() for t in tensors)

    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return {"params": local(params), "grads": local(p.grad for p in params if p.grad is not None),
            "optimizer": local(state)}


def trace_step(cfg: DictConfig, shapes: SampleShapes, world: int) -> StepTrace:
    """Trace one step of `cfg` (its `trainer.parallelism` and `trainer.batch_size` per rank)
    on `world` ranks. Raises ConfigError or ValueError for a layout that cannot run.

    Left out: SDC checks (`diagnostics.sdc`), the loss's and the peak-memory readings'
    one-number all-reduces. Attention runs torch's math kernel on the fake CPU tensors, which
    keeps the softmax probabilities for backward; CUDA's memory-efficient kernel keeps less."""
    par, trainer = cfg.trainer.parallelism, cfg.trainer
    check_traceable(cfg)
    deterministic = False
    layout = resolve_layout(world, par.data, par.tensor, par.ensemble)
    with fake_process_group(world):
        mesh = build_device_mesh(layout, "cpu") if world > 1 else None
        with torch.device("meta"):
            model = build_model(cfg.model, **shapes.layout())
        labels = {}
        if mesh is not None:
            parallelize_for_training(model, mesh, cfg)
            # a group of every rank is the tp (or dp) group itself when dp (or tp) is 1: named so
            labels = {all_ranks_mesh(mesh).get_group().group_name: "dp×ens×tp" if layout.ens > 1 else "dp×tp",
                      mesh["dp"].get_group().group_name: "dp", mesh["tp"].get_group().group_name: "tp"}
            if layout.ens > 1:
                labels.update({replica_mesh(mesh).get_group().group_name: "dp×ens",
                               mesh["ens"].get_group().group_name: "ens"})
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            model.train()
            ema = EMA(model, trainer.ema.decay) if trainer.ema.enabled else None
            optimizer = build_optimizer(model, trainer.optimizer, deterministic)
            # Adam's moments exist from the first step on, for the parameters that train (a
            # frozen one, `model.freeze`, never gets a gradient, so never a moment)
            optimizer.init_state()
            grid, channels = shapes.grid, shapes.state_channels + shapes.diagnostic
            loss_fn = WeightedLoss(torch.ones(grid[0]), torch.ones(channels), trainer.loss.function,
                                   crps_alpha=trainer.loss.crps_alpha)
            train_loss = MembersGathered(loss_fn, mesh["ens"].get_group()) if layout.ens > 1 else loss_fn
            memory, comm = StorageBytes(), CommVolume(labels)
            memory.hold(model, optimizer, loss_fn, list(ema.shadow.values()) if ema else [])
            held = memory.current
            with memory, comm:
                memory.reset_peak()
                advance_spectral_norm(model)
                step_batches = []  # the trainer keeps a step's micro-batches until the step ends
                for _ in range(trainer.grad_accum_steps):
                    batch = {key: torch.empty(shape) for key, shape in shapes.batch(trainer.batch_size).items()}
                    step_batches.append(batch)
                    here = trainer.ensemble_size // layout.ens  # members on this rank
                    block = MemberBlock(trainer.ensemble_size, here, 0) if layout.ens > 1 else None
                    with dropout_step(trainer.seed, 0, 0, trainer.batch_size * here, block):  # as a step draws them
                        backward_micro_batch(model, with_members(batch, here), train_loss,
                                             accum=trainer.grad_accum_steps,
                                             deterministic=deterministic,
                                             step_samples=trainer.batch_size * layout.dp * trainer.grad_accum_steps,
                                             forecast_steps=trainer.loss.forecast_steps, ensemble_ranks=layout.ens)
                update_parameters(model, optimizer, mesh, deterministic=deterministic, data=par.data,
                                  grad_clip=trainer.grad_clip)
                if ema is not None:
                    ema.update(model)
            return StepTrace(**shard_bytes(model, optimizer), held=held, peak=memory.peak,
                             sent=dict(comm.sent), collectives=dict(comm.calls))
