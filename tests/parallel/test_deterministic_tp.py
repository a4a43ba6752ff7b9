"""Deterministic mode (`model.gemm=deterministic`): tensor parallelism changes no bit.

Real gloo ranks. Every rank first computes the serial model (no parallelism) on the same
batch, then the same model sharded over tp = 4 (torch's Colwise/RowwiseParallel with
DetLinear, fixed-tree reductions across ranks), dropout on, and compares the loss, the
output and every gradient bitwise. A deliberately different cross-rank summation order
(rank order left to right, as a ring would add) must break the equality. Training in
every (dp, tp) layout, FSDP2 included, is tests/train/test_deterministic_training.py.
"""

import copy

import pytest
import torch
import torch.distributed as dist
from tp_step import full, step_with_dropout
from launcher import run_ranks

from credit.models.build import build_model
from credit.parallel import build_device_mesh, parallelize_model, resolve_layout

# widths give 32 per rank at tp = 4 (the GEMM's leaf), two stages, dropout on
DET_MODEL = dict(dim=[128, 128], depth=[1, 1], dim_head=32, local_window_size=[2, 2],
                 global_window_size=[2, 2], cross_embed_kernel_sizes=[[2, 4], [2, 4]],
                 cross_embed_strides=[2, 2], attn_dropout=0.1, ff_dropout=0.1, gemm="deterministic")
LAYOUT = dict(in_channels=6, out_channels=3, state_channels=3, history_len=1, grid=(16, 32))


def _batch(n: int) -> torch.Tensor:
    i = torch.arange(n * 6 * 16 * 32, dtype=torch.float64)
    return torch.sin(i * 0.37).view(n, 6, 16, 32).float()


def _ring_order(t, group):
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def tp_matches_serial(data: str) -> list[str]:
    """What differs between one process and this rank's tp-sharded model (empty: nothing)."""
    torch.manual_seed(0)
    model = build_model(DET_MODEL, **LAYOUT).train()
    serial = copy.deepcopy(model)
    x = _batch(2)
    ref_loss, ref_y = step_with_dropout(serial, x)

    mesh = build_device_mesh(resolve_layout(dist.get_world_size(), data, dist.get_world_size()), "cpu")
    parallelize_model(model, mesh, data)
    loss, y = step_with_dropout(model, x)
    wrong = []
    if not torch.equal(loss, ref_loss):
        wrong.append(f"loss {loss.item()!r} vs {ref_loss.item()!r}")
    if not torch.equal(full(y), ref_y):
        wrong.append("output")
    ref_grads = dict(serial.named_parameters())
    for name, p in model.named_parameters():
        # fsdp2 shards blocks without tp over all ranks and averages identical copies
        # with its own reduction; only the tensor-parallel blocks are checked there.
        if data == "fsdp2" and not name.startswith("stages."):
            continue
        if not torch.equal(full(p.grad), ref_grads[name].grad):
            wrong.append(f"grad {name}")
    return wrong


def tree_then_ring() -> dict[str, list[str]]:
    """One launch (spawning ranks dominates the cost): the fixed tree, then rank-order
    summation patched in over the same model and batch."""
    out = {"tree": tp_matches_serial("none")}
    import credit.kernels.gemm._dtensor as dt

    dt._tree_reduce = _ring_order
    out["ring"] = tp_matches_serial("none")
    return out


@pytest.fixture(scope="module")
def tp4():
    return run_ranks(tree_then_ring, 4)


def test_tp4_is_bitwise_serial(tp4):
    assert [r["tree"] for r in tp4] == [[]] * 4, tp4[0]["tree"]


def test_a_different_summation_order_breaks_it(tp4):
    assert tp4[0]["ring"], "rank-order summation at tp=4 still matched serial: the test cannot see order"
