"""The communication checks on FSDP2's two collectives.

all-gather: on a checked step every rank checksums the shard it is about to send (before
the forward) and, inside each unit's forward (a pre-hook that runs after FSDP2's unshard),
the gathered tensor in shard-sized row blocks. Block r must equal what its owner sent, on
every rank of the shard group; the modal value among the owner's and every receiver's
checksum is the reference, so a bad receive, a bad send and a bad owner are told apart.

reduce-scatter: each unit's reduce-scatter is wrapped. On a checked step, after the real
reduce-scatter, the same input is exchanged a second way (point-to-point sends of every
rank's chunk of this rank's shard, not the collective FSDP2 used) and added here in rank
order: deterministic mode's rank-order tree must match bit for bit; in fast mode the two
sums of n terms (each within (n-1) u sum|x| of the exact sum, and within u of it after
dividing for an average) may differ by at most 2 u sum_r |x_r| (/n when averaging): an
element is flagged beyond twice that (4 u), u the reduce dtype's unit roundoff.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter  # torch 2.13: not re-exported

from credit.diagnostics.checksum import bit_checksum, chunk_checksums, flip_bit, local, raw_bits
from credit.diagnostics.compute import unit_roundoff
from credit.diagnostics.fsdp_units import FSDPUnit
from credit.diagnostics.slots import Injection, SlotTable
from credit.diagnostics.verdict import Mismatch, disagreeing, layer_of
from credit.kernels.gemm._tree import tree_sum
from credit.parallel.tree_reduce import TreeReduceScatter

StepContext = Callable[[], tuple[torch.Tensor | None, int]]


class _UnitCheck:
    """What both checks hold: the units, the fault to inject, whether to compare, and the
    step's buffer and number (`context()`: the buffer is None on unchecked steps)."""

    def __init__(self, units: list[FSDPUnit], injection: Injection | None, rank: int,
                 enabled: bool, context: StepContext) -> None:
        self.units = units
        self.injection = injection
        self.rank = rank
        self.enabled = enabled
        self.context = context
        self.spans: dict[str, slice] = {}


class AllGatherCheck(_UnitCheck):
    check = "all_gather"

    def __init__(self, units: list[FSDPUnit], slots: SlotTable, injection: Injection | None,
                 rank: int, enabled: bool, context: StepContext) -> None:
        super().__init__(units, injection, rank, enabled, context)
        # per parameter: the checksum it sent, gathered this step (0/1), one per shard block
        self.done: set[str] = set()
        for unit in units:
            for param in unit.params:
                self.spans[param.name] = slots.reserve(2 + len(unit.group_ranks))
            for module in unit.modules:
                module.register_forward_pre_hook(lambda _m, _a, unit=unit: self._gathered(unit))

    def metadata(self) -> dict[str, tuple[int, ...]]:
        return {p.name: u.group_ranks for u in self.units for p in u.params}

    @torch.no_grad()
    def begin(self, buffer: torch.Tensor) -> None:
        """Before the forward: the shards each rank sends (in the dtype FSDP2 gathers)."""
        self.done.clear()
        if not self.enabled:
            return
        for unit in self.units:
            for param in unit.params:
                shard = local(param.sharded)
                if param.gather_dtype is not None:
                    shard = shard.to(param.gather_dtype)
                buffer[self.spans[param.name].start] = bit_checksum(shard)

    @torch.no_grad()
    def _gathered(self, unit: FSDPUnit) -> None:
        buffer, step = self.context()
        if buffer is None or unit.name in self.done:  # not checked, or a recompute
            return
        self.done.add(unit.name)
        for param in unit.params:
            gathered = getattr(param.module, param.attr)
            if param.attr == "weight" and self.injection is not None and self.injection.due(
                    "all_gather", layer_of(param.name), self.rank, step):
                flip_bit(gathered, self.injection.index, self.injection.bit)
            if self.enabled:
                span = self.spans[param.name]
                buffer[span.start + 1] = 1
                buffer[span.start + 2: span.stop] = chunk_checksums(gathered, len(unit.group_ranks))

    def verdict(self, step: int, rows: list[list[int]], groups: list[dict[str, tuple[int, ...]]]
                ) -> tuple[set[tuple[str, str]], list[Mismatch]]:
        verified, found = set(), []
        for name, span in self.spans.items():
            by_group: dict[tuple[int, ...], list[int]] = {}
            for rank in range(len(rows)):
                if rows[rank][span.start + 1]:  # gathered this step
                    by_group.setdefault(groups[rank][name], []).append(rank)
            for group, members in by_group.items():
                if len(group) < 2:
                    continue
                verified.add((layer_of(name), self.check))
                for block, owner in enumerate(group):
                    values = {("sent", owner): rows[owner][span.start]}
                    values.update({("got", r): rows[r][span.start + 2 + block] for r in members})
                    found += self._disagreements(step, name, block, owner, values, list(group))
        return verified, found

    def _disagreements(self, step, name, block, owner, values, peers) -> list[Mismatch]:
        expected, bad, candidates = disagreeing(values)
        out = []
        for role, rank in bad:
            what = (f"shard {block} as rank {rank} sent it" if role == "sent"
                    else f"shard {block} (from rank {owner}) as rank {rank} received it")
            out.append(Mismatch(step, rank, layer_of(name), "comm", self.check, name, expected,
                                values[role, rank], peers,
                                {k: sorted({r for _, r in v}) for k, v in candidates.items()}
                                if candidates else None, what))
        return out


class CheckedReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter (or deterministic mode's tree) followed, on checked steps, by
    the second reduction path; also where a gradient-shard fault is injected."""

    def __init__(self, inner: ReduceScatter, unit: FSDPUnit, owner: "ReduceScatterCheck") -> None:
        self.inner, self.unit, self.owner = inner, unit, owner

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op: object = None, async_op: bool = False):
        work = self.inner(output_tensor=output_tensor, input_tensor=input_tensor, group=group,
                          op=op, async_op=async_op)
        buffer, step = self.owner.context()
        if buffer is None:
            return work
        if work is not None:
            work.wait()
        self.owner.after_reduce(self.unit, buffer, step, output_tensor, input_tensor, group, op,
                                isinstance(self.inner, TreeReduceScatter) and self.inner)
        return None


class ReduceScatterCheck(_UnitCheck):
    check = "reduce_scatter"

    def __init__(self, units: list[FSDPUnit], slots: SlotTable, injection: Injection | None,
                 rank: int, enabled: bool, context: StepContext) -> None:
        super().__init__(units, injection, rank, enabled, context)
        for unit in units:
            # ran, ok, checksum of the shard, of the second path's, first bad element
            self.spans[unit.name] = slots.reserve(5)
            group = unit.param_group
            group._reduce_scatter_comm = CheckedReduceScatter(group._reduce_scatter_comm, unit, self)

    def begin(self, buffer: torch.Tensor) -> None:
        for span in self.spans.values():
            buffer[span.start + 1] = 1  # ok until a reduce-scatter of the step says otherwise

    @staticmethod
    def _offsets(unit: FSDPUnit) -> list[tuple[str, int, int]]:
        out, start = [], 0
        for param in unit.params:
            out.append((param.name, start, param.shard_numel))
            start += param.shard_numel
        return out

    @torch.no_grad()
    def after_reduce(self, unit: FSDPUnit, buffer: torch.Tensor, step: int, output: torch.Tensor,
                     input: torch.Tensor, group: dist.ProcessGroup, op: object,
                     tree: TreeReduceScatter | None) -> None:
        if self.injection is not None and self.injection.kind == "grad_shard":
            for name, start, numel in self._offsets(unit):
                if name.endswith(".weight") and self.injection.due(
                        "grad_shard", name[: -len(".weight")], self.rank, step):
                    if self.injection.index >= numel:
                        raise ValueError(f"diagnostics.sdc.inject.index={self.injection.index} is "
                                         f"outside {name}'s gradient shard of {numel} elements")
                    flip_bit(output, start + self.injection.index, self.injection.bit)
        if not self.enabled:
            return
        expected, ok = self._second_path(output, input, group, op, tree)
        span = self.spans[unit.name]
        first_bad = (~ok).long().argmax()
        failed = ~ok.all() & (buffer[span.start + 1] == 1)
        record = torch.stack([bit_checksum(output), bit_checksum(expected), first_bad])
        buffer[span.start] = 1
        buffer[span.start + 2: span.stop] = torch.where(failed, record, buffer[span.start + 2: span.stop])
        buffer[span.start + 1] = buffer[span.start + 1] * ok.all().long()

    @staticmethod
    def _second_path(output, input, group, op, tree):
        """This rank's shard reduced again: every rank's chunk received point to point."""
        ranks = dist.get_process_group_ranks(group)
        me = dist.get_rank(group)
        chunks = input.view(len(ranks), -1)
        received = torch.empty_like(chunks)
        received[me] = chunks[me]
        ops = []
        for j, peer in enumerate(ranks):
            if j != me:
                ops.append(dist.P2POp(dist.isend, chunks[j].contiguous(), peer, group=group))
                ops.append(dist.P2POp(dist.irecv, received[j], peer, group=group))
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        rows = list(received.unbind(0))
        if tree:
            expected = tree_sum(rows)
            if tree.copies > 1:
                expected = expected / tree.copies
            return expected, raw_bits(output) == raw_bits(expected)
        average = op == dist.ReduceOp.AVG
        if not (average or op == dist.ReduceOp.SUM):
            raise NotImplementedError(f"diagnostics.sdc reduce-scatter check: unsupported op {op}")
        expected = torch.zeros_like(rows[0])
        for row in rows:
            expected += row
        magnitude = received.abs().sum(dim=0)
        if average:
            expected, magnitude = expected / len(rows), magnitude / len(rows)
        bound = 4 * unit_roundoff(output.dtype) * magnitude
        flat = output.reshape(-1)
        ok = ((flat - expected).abs() <= bound) | (flat.isnan() & expected.isnan())
        return expected, ok

    def verdict(self, step: int, rows: list[list[int]]) -> tuple[set[tuple[str, str]], list[Mismatch]]:
        verified, found = set(), []
        for unit in self.units:
            span = self.spans[unit.name]
            offsets = self._offsets(unit)
            for rank, values in enumerate(rows):
                ran, ok, got, expected, bad = values[span]
                if not ran:
                    continue
                verified.add((unit.name, self.check))
                if ok:
                    continue
                name, start = next(((n, s) for n, s, numel in offsets if s <= bad < s + numel),
                                   (unit.name, 0))
                found.append(Mismatch(step, rank, layer_of(name), "comm", self.check, name, expected,
                                      got, list(unit.group_ranks),
                                      detail=f"element {bad - start} of this rank's gradient shard "
                                             f"differs from the second reduction (unit {unit.name})"))
        return verified, found
