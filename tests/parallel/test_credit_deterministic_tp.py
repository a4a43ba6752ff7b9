"""CREDIT's models in deterministic mode: tensor parallelism changes no bit.

Real gloo ranks. Each rank computes the one-process model, then the same model sharded over
tp = 2 (each rank's part of every tensor-parallel width 32 wide, the alignment rule of
docs/determinism.md), on the same batch with dropout and spectral norm on, and compares the
loss, the output and every parameter's gradient bit for bit: the position-bias MLPs (whose
gradient adds every head's) and the spectral bottleneck's tensor-parallel MLP included.
"""

import copy

import pytest
import torch
import torch.distributed as dist
from tp_step import TINY_CREDIT, TINY_MODELS, full, step_with_dropout, tiny_batch
from launcher import run_ranks
from torch.distributed.tensor import DTensor

from credit.models.credit.config import build_credit_model, resolve_credit_model
from credit.parallel import build_device_mesh, parallelize_model, resolve_layout

COMMON = {**TINY_CREDIT, "dim": [64, 128, 256, 512]}
MODELS = TINY_MODELS


def tp_matches_serial(names: list[str]) -> dict[str, list[str]]:
    """Per model, what differs between one process and this rank's tp-sharded model."""
    out = {}
    for name in names:
        torch.manual_seed(0)
        kind, values = resolve_credit_model({**COMMON, **MODELS[name]})
        model = build_credit_model(kind, values, "deterministic").train()
        serial = copy.deepcopy(model)
        x = tiny_batch(2)
        ref_loss, ref_y = step_with_dropout(serial, x)
        mesh = build_device_mesh(resolve_layout(dist.get_world_size(), "none", dist.get_world_size()), "cpu")
        parallelize_model(model, mesh, "none")
        loss, y = step_with_dropout(model, x)
        wrong = [] if torch.equal(loss, ref_loss) else [f"loss {loss.item()!r} vs {ref_loss.item()!r}"]
        if not torch.equal(full(y), ref_y):
            wrong.append("output")
        reference = dict(serial.named_parameters())
        sharded = [n for n, p in model.named_parameters() if isinstance(p, DTensor)]
        wrong += [f"grad {n}" for n, p in model.named_parameters()
                  if not torch.equal(full(p.grad), reference[n].grad)]
        out[name] = wrong if sharded else ["nothing was sharded"]
    return out


@pytest.fixture(scope="module")
def tp2():
    return run_ranks(tp_matches_serial, 2, list(MODELS))


@pytest.mark.parametrize("name", list(MODELS))
def test_tp2_is_bitwise_one_process(tp2, name):
    assert [rank[name] for rank in tp2] == [[], []], tp2[0][name][:8]
