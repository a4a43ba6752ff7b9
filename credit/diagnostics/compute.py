"""The compute check: every Linear's output row recomputed alone (M = 1) on checked steps.

A forward hook on each `nn.Linear` (installed before tensor parallelism, so it sees the
layer's own result: a Shard or Partial DTensor, before the TP output hook redistributes it)
re-runs the layer's forward on one row of its input and compares it with that row of the
batched output. The row changes with the step.

Deterministic GEMM mode: the GEMM is batch-invariant, so the row must match bit for bit.
Fast mode: the batched and the single-row GEMM may use different kernels and summation
orders. Each result is within gamma_K * (|x| @ |W|^T) of the exact dot products (gamma_K ~
K u, K the local inner dimension, u the accumulator's unit roundoff: fp32 accumulation is
assumed, as CPU and GPU GEMMs do for fp32, bf16 and fp16), plus one rounding to the output
dtype (u_out |y|) and, where fp32 GEMMs may use TF32/bf16 products
(`torch.get_float32_matmul_precision()` high/medium), one product rounding each. Two results
each within that bound differ by at most twice it, so an element is flagged when
  |y_batched - y_row| > 2 (K u_acc + 2 u_out + 2 u_mul) (|x| @ |W|^T + |b|).
Flips of low mantissa bits can hide under that bound; exponent and high mantissa bits
cannot.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from credit.diagnostics.checksum import bit_checksum, flip_bit, local, raw_bits
from credit.diagnostics.slots import Injection, SlotTable
from credit.diagnostics.verdict import Mismatch
from credit.models.spectral_norm import has_spectral_norm

_U_ACC = 2.0 ** -24
_U_MUL = {"highest": 0.0, "high": 2.0 ** -11, "medium": 2.0 ** -8}


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def checked_row(step: int, rows: int) -> int:
    """The row a checked step recomputes: spread over the rows as steps go by."""
    return (step * 2654435761) % rows


class ComputeCheck:
    check = "compute"

    def __init__(self, model: nn.Module, slots: SlotTable, deterministic: bool,
                 injection: Injection | None, rank: int, enabled: bool,
                 context: Callable[[], tuple[torch.Tensor | None, int]]) -> None:
        self.deterministic = deterministic
        self.injection = injection
        self.rank = rank
        self.enabled = enabled
        self.context = context  # () -> (this step's buffer or None when not checked, step)
        self.layers: list[tuple[str, slice]] = []
        self.done: set[str] = set()
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear):
                span = slots.reserve(4)  # ran, ok, checksum of the batched row, of the single row
                self.layers.append((name, span))
                module.register_forward_hook(partial(self._hook, name, span))

    def layer_names(self) -> list[str]:
        return [name for name, _ in self.layers]

    def begin(self) -> None:
        self.done.clear()

    @torch.no_grad()
    def _hook(self, name: str, span: slice, module: nn.Linear, args: tuple, out: torch.Tensor) -> None:
        buffer, step = self.context()
        if buffer is None or name in self.done:  # not checked, or a checkpointed recompute
            return
        self.done.add(name)
        x = args[0]
        out_local = local(out)
        width = out_local.shape[-1]
        row = checked_row(step, out_local.numel() // width)
        if self.injection is not None and self.injection.due("gemm_output", name, self.rank, step):
            if self.injection.index >= width:
                raise ValueError(f"diagnostics.sdc.inject.index={self.injection.index} is outside "
                                 f"{name}'s output row of {width} columns on this rank")
            flip_bit(out_local, row * width + self.injection.index, self.injection.bit)
        if not self.enabled:
            return
        got = out_local.reshape(-1, width)[row]
        alone = local(type(module).forward(module, x.reshape(-1, x.shape[-1])[row: row + 1]))
        expected = alone.reshape(-1, width)[0]
        if self.deterministic:
            ok = (raw_bits(got) == raw_bits(expected)).all()
        else:
            ok = self._within_bound(module, x, row, got, expected).all()
        # stays on the device: the step's one collective carries it (no host sync per layer)
        buffer[span] = torch.stack([torch.ones_like(ok, dtype=torch.int64), ok.long(),
                                    bit_checksum(got), bit_checksum(expected)]).to(buffer.device)

    @staticmethod
    def _within_bound(module: nn.Linear, x: torch.Tensor, row: int, got: torch.Tensor,
                      expected: torch.Tensor) -> torch.Tensor:
        x_row = local(x).reshape(-1, local(x).shape[-1])[row].abs().float()
        # a spectral-normed layer computes with W / sigma (u, v as this step left them)
        weight = module.normalized_weight() if has_spectral_norm(module) else module.weight
        weight = local(weight).abs().float()
        magnitude = weight @ x_row
        if module.bias is not None:
            magnitude = magnitude + local(module.bias).abs().float()
        inner = x_row.numel()
        u_mul = 0.0
        if got.dtype == torch.float32 and got.is_cuda:
            u_mul = _U_MUL[torch.get_float32_matmul_precision()]
        bound = 2 * (inner * _U_ACC + 2 * unit_roundoff(got.dtype) + 2 * u_mul) * magnitude
        diff = (got.float() - expected.float()).abs()
        return (diff <= bound) | (got.isnan() & expected.isnan())

    def verdict(self, step: int, rows: list[list[int]]) -> tuple[set[tuple[str, str]], list[Mismatch]]:
        verified, found = set(), []
        for name, span in self.layers:
            for rank, values in enumerate(rows):
                ran, ok, got, expected = values[span]
                if not ran:
                    continue
                verified.add((name, self.check))
                if not ok:
                    found.append(Mismatch(step, rank, name, "compute", self.check, f"{name} output",
                                          expected, got, detail="batched row != the row recomputed alone"))
        return verified, found
