"""`SDCDetector`: the checks of `diagnostics.sdc` wired into the training step.

Lifecycle: `attach_compute(model)` before parallelization (the compute check's hooks must
see each Linear's own output, before tensor parallelism's output hooks), `attach(model)`
after it (FSDP2 units, replica labels, one exchange of static metadata), then per step
`begin_step(step)` before the forward and `end_step()` after the optimizer and EMA. A
checked step fills one int64 vector on every rank and compares it in one all-gather; every
rank computes the same verdict from it, so every rank takes the same action.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch import nn

from credit.compat import all_gather_single
from credit.config.validate import ConfigError
from credit.diagnostics.comm import AllGatherCheck, ReduceScatterCheck
from credit.diagnostics.compute import ComputeCheck
from credit.diagnostics.fsdp_units import fsdp_units
from credit.diagnostics.replica import ReplicaCheck
from credit.diagnostics.slots import Injection, SlotTable
from credit.diagnostics.verdict import Mismatch

log = logging.getLogger(__name__)

class SDCError(RuntimeError):
    """A checked step found corrupted data and `diagnostics.sdc.action` says stop (or a
    rollback cannot recover)."""


SDC_COLUMNS = ("sdc_checks_run", "layers_verified", "layer_checksum_mismatches", "sdc_rollbacks")


@dataclass
class StepReport:
    checks_run: int = 0  # checks compared this step (comm counts all-gather and reduce-scatter)
    layers_verified: int = 0  # distinct (layer, check) pairs compared
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def corrupted_layers(self) -> list[str]:
        return sorted({m.layer for m in self.mismatches})


class SDCDetector:
    def __init__(self, sdc: DictConfig, *, deterministic: bool, run_dir: Path, rank: int,
                 world_size: int, device: torch.device) -> None:
        self.checks = list(sdc.checks)
        self.every = sdc.every_n_steps
        self.deterministic = deterministic
        self.path = Path(run_dir) / "sdc.jsonl"
        self.rank, self.world_size, self.device = rank, world_size, device
        inject = sdc.inject
        self.injection = None
        if inject.kind != "none":
            if inject.rank >= world_size:
                raise ConfigError(f"diagnostics.sdc.inject.rank={inject.rank} is invalid: the run "
                                  f"has ranks 0..{world_size - 1}")
            self.injection = Injection(inject.kind, inject.layer, inject.rank, inject.step,
                                       inject.bit, inject.index)
        self.slots = SlotTable()
        self.buffer: torch.Tensor | None = None  # set on checked steps only
        self.step = 0
        self.compute: ComputeCheck | None = None
        self.all_gather: AllGatherCheck | None = None
        self.reduce_scatter: ReduceScatterCheck | None = None
        self.replica: ReplicaCheck | None = None
        self.metadata: list[dict] = []

    def _context(self) -> tuple[torch.Tensor | None, int]:
        return self.buffer, self.step

    # ------------------------------------------------------------------ setup
    def attach_compute(self, model: nn.Module) -> None:
        """Before tensor parallelism: the compute check's (and gemm_output fault's) hooks."""
        self.compute = ComputeCheck(model, self.slots, self.deterministic, self.injection,
                                    self.rank, "compute" in self.checks, self._context)
        if self.injection is not None and self.injection.layer not in self.compute.layer_names():
            names = self.compute.layer_names()
            raise ConfigError(f"diagnostics.sdc.inject.layer={self.injection.layer!r} is not an "
                              f"nn.Linear of the model; e.g. {names[:3]} ({len(names)} in all)")

    def attach(self, model: nn.Module) -> None:
        """After parallelization: the comm checks on FSDP2's units, the replica labels."""
        units = [u for u in fsdp_units(model) if len(u.group_ranks) > 1]
        comm = "comm" in self.checks
        if comm and not units:
            raise ConfigError("diagnostics.sdc.checks includes 'comm', but this run has no FSDP2 "
                              "unit sharded over more than one rank (trainer.parallelism.data="
                              "fsdp2 with dp > 1 or tensor > 1 has them); drop 'comm'")
        needs_units = self.injection is not None and self.injection.kind in ("all_gather", "grad_shard")
        if needs_units and not units:
            raise ConfigError(f"diagnostics.sdc.inject.kind={self.injection.kind!r} needs FSDP2 "
                              f"units sharded over more than one rank (trainer.parallelism.data=fsdp2)")
        if comm or needs_units:
            self.all_gather = AllGatherCheck(units, self.slots, self.injection, self.rank, comm,
                                             self._context)
            self.reduce_scatter = ReduceScatterCheck(units, self.slots, self.injection, self.rank,
                                                     comm, self._context)
        if "replica" in self.checks:
            self.replica = ReplicaCheck(model, self.slots)
        local = {"gather": self.all_gather.metadata() if self.all_gather else {},
                 "replica": self.replica.metadata() if self.replica else {}}
        self.metadata = [local]
        if self.world_size > 1:
            self.metadata = [None] * self.world_size
            dist.all_gather_object(self.metadata, local)  # once: static shapes of the groups
        if self.replica is not None and not ReplicaCheck.comparable([m["replica"] for m in self.metadata]):
            raise ConfigError("diagnostics.sdc.checks includes 'replica', but no parameter has a "
                              "copy on more than one rank in this layout (tensor > 1 or data=ddp "
                              "with dp > 1 has them); drop 'replica'")
        self._check_injection_target(units)

    def _check_injection_target(self, units) -> None:
        if self.injection is None or self.injection.kind not in ("all_gather", "grad_shard"):
            return
        weight = f"{self.injection.layer}.weight"
        if not any(p.name == weight for u in units for p in u.params):
            raise ConfigError(f"diagnostics.sdc.inject.layer={self.injection.layer!r}: its weight is "
                              f"not in an FSDP2 unit sharded over more than one rank")

    def describe(self) -> str:
        """The startup line: what runs, how often, and what a mismatch does."""
        active = []
        if self.all_gather is not None and "comm" in self.checks:
            active.append(f"comm (all_gather + reduce_scatter on {len(self.all_gather.units)} FSDP2 units)")
        if self.replica is not None:
            active.append(f"replica ({len(self.replica.params)} parameters)")
        if self.compute is not None and "compute" in self.checks:
            mode = "bitwise" if self.deterministic else "magnitude bound"
            active.append(f"compute ({len(self.compute.layers)} Linear layers, one row each, {mode})")
        line = f"sdc checks ON every {self.every} steps: " + "; ".join(active)
        if self.injection is not None:
            inj = self.injection
            line += (f"; INJECTING {inj.kind} into {inj.layer} on rank {inj.rank} at step "
                     f"{inj.step} (bit {inj.bit}, element {inj.index})")
        return line

    # ------------------------------------------------------------------ steps
    def begin_step(self, step: int) -> None:
        """`step` is the 1-based step about to run (as metrics.csv numbers it)."""
        self.step = step
        self.buffer = None
        if step % self.every:
            return
        self.buffer = self.slots.new_buffer(self.device)
        if self.compute is not None:
            self.compute.begin()
        if self.all_gather is not None:
            self.all_gather.begin(self.buffer)
        if self.reduce_scatter is not None:
            self.reduce_scatter.begin(self.buffer)

    def end_step(self) -> StepReport:
        """After the optimizer step: compare this step's checksums across ranks (one collective)."""
        buffer, self.buffer = self.buffer, None
        if buffer is None:
            return StepReport()
        if self.replica is not None:
            self.replica.record(buffer)
        if self.world_size > 1:
            everyone = torch.empty(self.world_size * buffer.numel(), dtype=buffer.dtype,
                                   device=buffer.device)
            all_gather_single(everyone, buffer)
            rows = everyone.view(self.world_size, -1).tolist()
        else:
            rows = [buffer.tolist()]
        return self._verdict(rows)

    def _verdict(self, rows: list[list[int]]) -> StepReport:
        verified: set = set()
        found: list[Mismatch] = []
        checks_run = 0
        parts = []
        if self.all_gather is not None and "comm" in self.checks:
            groups = [m["gather"] for m in self.metadata]
            parts += [self.all_gather.verdict(self.step, rows, groups),
                      self.reduce_scatter.verdict(self.step, rows)]
        if self.replica is not None:
            parts.append(self.replica.verdict(self.step, rows, [m["replica"] for m in self.metadata]))
        if self.compute is not None and "compute" in self.checks:
            parts.append(self.compute.verdict(self.step, rows))
        for v, f in parts:
            checks_run += 1
            verified |= v
            found += f
        report = StepReport(checks_run, len(verified), found)
        if found:
            self._write(found)
        return report

    def _write(self, found: list[Mismatch]) -> None:
        if self.rank != 0:  # every rank holds the same verdict; rank 0 reports it
            return
        for m in found:
            log.error("SDC MISMATCH step %d rank %d layer %s path %s (%s) tensor %s: expected %s "
                      "got %s; %s", m.step, m.rank, m.layer, m.path, m.check, m.tensor,
                      m.expected, m.got, m.detail)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            for m in found:
                f.write(json.dumps({"event": "mismatch", **m.record()}) + "\n")

    def note(self, event: dict) -> None:
        """Append a non-mismatch event (a rollback) to sdc.jsonl (rank 0)."""
        if self.rank == 0:
            with self.path.open("a") as f:
                f.write(json.dumps(event) + "\n")
