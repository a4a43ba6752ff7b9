"""`credit sdc-probe`: qualify a cluster's ranks for silent data corruption before a run.

Builds a stack of identical transformer blocks (the windowformer's attention and feed-forward,
the same weights on every layer and every rank from a fixed seed), parallelises it like
training does (tensor parallelism, then `fully_shard` per block), and runs it `iterations`
times on one fixed input, every layer fed that same input. With every check of
`diagnostics.sdc` on every iteration (comm, compute, and replica under tensor parallelism),
plus one more: every layer's output must carry the same bits on every rank and every
layer. Prints a per-layer, per-rank table of mismatches; exit code 1 on any mismatch.
"""

from __future__ import annotations

import copy
import logging
import re
from collections import Counter

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch import nn

from credit.compat import all_gather_single
from credit.diagnostics.checksum import bit_checksum
from credit.diagnostics.detector import SDCDetector
from credit.diagnostics.verdict import Mismatch, disagreeing
from credit.models.windowformer.model import Attention, FeedForward
from credit.parallel import build_runtime, parallelize_model

log = logging.getLogger(__name__)


class ProbeBlock(nn.Module):
    def __init__(self, dim: int, dim_head: int, window: int, gemm: str) -> None:
        super().__init__()
        self.attn = Attention(dim, dim_head, window, "local", 0.0, gemm)
        self.ff = FeedForward(dim, 4, 0.0, gemm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.ff(x)


class ProbeStack(nn.Module):
    """`layers` copies of one block; forward runs each on the same input."""

    _shard_units = ("layers",)

    def __init__(self, block: ProbeBlock, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(block) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([layer(x) for layer in self.layers])


def _layer_index(name: str) -> int | None:
    match = re.match(r"layers\.(\d+)", name)
    return int(match.group(1)) if match else None


def run_probe(cfg: DictConfig, layers: int, dim: int, iterations: int) -> int:
    """Run the probe as this rank; returns the exit code (0 clean, 1 any mismatch)."""
    runtime = build_runtime(cfg)
    world = runtime.layout.world_size if runtime.layout else 1
    gemm = cfg.model.gemm
    torch.manual_seed(cfg.trainer.seed)  # the same weights and input on every rank
    model = ProbeStack(ProbeBlock(dim, cfg.model.dim_head, 4, gemm), layers).to(runtime.device)
    x = torch.randn(2, 8, 8, dim, device=runtime.device)
    detector = SDCDetector(cfg.diagnostics.sdc, deterministic=gemm == "deterministic",
                           run_dir=cfg.run_dir, rank=runtime.rank, world_size=world,
                           device=runtime.device)
    detector.attach_compute(model)
    if runtime.mesh is not None:
        parallelize_model(model, runtime.mesh, "fsdp2", deterministic=gemm == "deterministic")
    detector.attach(model)
    if runtime.is_main:
        lay = runtime.layout
        shape = f"dp {lay.dp} x tp {lay.tp}" if lay else "1 process"
        log.info("sdc-probe: %d ranks (%s), %d identical layers of width %d, %d iterations, "
                 "gemm %s, %s", world, shape, layers, dim, iterations, gemm, runtime.device)
        log.info("%s", detector.describe())
    found: list[Mismatch] = []
    verified = 0
    for iteration in range(1, iterations + 1):
        detector.begin_step(iteration)
        outputs = model(x)
        outputs.float().square().mean().backward()
        model.zero_grad(set_to_none=True)
        report = detector.end_step()
        verified += report.layers_verified
        found += report.mismatches + _output_mismatches(iteration, outputs, world)
    if runtime.is_main:
        print(_table(found, layers, world, verified, iterations), flush=True)
    if dist.is_initialized():
        dist.barrier()  # the table is out before any rank exits (a non-zero exit ends the job)
        dist.destroy_process_group()
    return 1 if found else 0


def _output_mismatches(iteration: int, outputs: torch.Tensor, world: int) -> list[Mismatch]:
    """Every (rank, layer) output against the modal one: identical weights, identical input."""
    sums = torch.stack([bit_checksum(out) for out in outputs])
    if world > 1:
        everyone = torch.empty(world * sums.numel(), dtype=sums.dtype, device=sums.device)
        all_gather_single(everyone, sums)
        rows = everyone.view(world, -1).tolist()
    else:
        rows = [sums.tolist()]
    values = {(rank, layer): value for rank, row in enumerate(rows) for layer, value in enumerate(row)}
    expected, bad, _ = disagreeing(values)
    return [Mismatch(iteration, rank, f"layers.{layer}", "compute", "output", f"layers.{layer} output",
                     expected, values[rank, layer], detail="output differs from the other layers'")
            for rank, layer in bad]


def _table(found: list[Mismatch], layers: int, world: int, verified: int, iterations: int) -> str:
    bad = Counter((_layer_index(m.layer), m.rank) for m in found)
    lines = ["layer " + "".join(f"{'rank ' + str(r):>9}" for r in range(world))]
    for layer in range(layers):
        cells = "".join(f"{('ok' if not bad[layer, r] else str(bad[layer, r]) + ' bad'):>9}"
                        for r in range(world))
        lines.append(f"{layer:<6}{cells}")
    for m in found:
        lines.append(f"MISMATCH iteration {m.step} rank {m.rank} {m.layer} {m.path} ({m.check}) "
                     f"{m.tensor}: expected {m.expected} got {m.got}; {m.detail}")
    verdict = "FAIL" if found else "PASS"
    lines.append(f"{verdict}: {len(found)} mismatch(es); {verified} layer checks and "
                 f"{layers * world * iterations} layer outputs verified over {iterations} iterations")
    return "\n".join(lines)
