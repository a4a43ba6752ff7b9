"""Tensor-parallel numerics on real gloo ranks with a CPU DeviceMesh."""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from launcher import run_ranks
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from credit.models.windowformer.model import TransformerStage
from credit.parallel import (
    apply_native_tensor_parallel,
    build_device_mesh,
    clip_grad_norm_,
    parallelize_model,
    resolve_layout,
    total_grad_norm,
)


def _deterministic(shape, scale=0.1):
    """Non-zero, rank-independent values without relying on any RNG."""
    n = torch.arange(1, 1 + int(torch.tensor(shape).prod()), dtype=torch.float64)
    return (torch.sin(n * 0.7) * scale + scale * 0.05).view(shape).float()


def linear_identities():
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    x = _deterministic((4, 8), 1.0)

    # column-parallel: each rank holds rows [rank] of W and computes x @ W[shard]^T
    w_col = _deterministic((12, 8))
    col = nn.Linear(8, 12, bias=False)
    col.weight = nn.Parameter(w_col.clone())
    parallelize_module(col, mesh, ColwiseParallel())
    rows = 12 // world
    col_expected = F.linear(x, w_col[rank * rows : (rank + 1) * rows])
    col_out = col(x)

    # row-parallel: rank holds columns [rank] of W and x; the all-reduced output is x @ W^T
    w_row, b_row = _deterministic((8, 12)), _deterministic((8,))
    row = nn.Linear(12, 8)
    row.weight, row.bias = nn.Parameter(w_row.clone()), nn.Parameter(b_row.clone())
    parallelize_module(row, mesh, RowwiseParallel())
    x_full = _deterministic((4, 12), 1.0)
    cols = 12 // world
    row_out = row(x_full[:, rank * cols : (rank + 1) * cols])
    row_expected = x_full.double() @ w_row.double().T + b_row.double()
    gathered = [torch.empty_like(row_out) for _ in range(world)]
    dist.all_gather(gathered, row_out)

    # a 2-layer MLP (colwise up, rowwise down) against the same MLP run serially
    mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    with torch.no_grad():
        for i, (o, k) in ((0, (16, 8)), (2, (8, 16))):
            mlp[i].weight.copy_(_deterministic((o, k)))
            mlp[i].bias.copy_(_deterministic((o,)))
    serial = copy.deepcopy(mlp)
    parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    mlp_diff = (mlp(x) - serial(x)).abs().max().item()

    return {
        "col_equal": torch.equal(col_out, col_expected),
        "col_shape": tuple(col_out.shape),
        "row_diff": (row_out.double() - row_expected).abs().max().item(),
        "row_ranks_identical": all(torch.equal(g, gathered[0]) for g in gathered),
        "mlp_diff": mlp_diff,
    }


@pytest.mark.parametrize("world", [2, 4])
def test_column_row_and_mlp_identities(world):
    for result in run_ranks(linear_identities, world):
        assert result["col_equal"] and result["col_shape"] == (4, 12 // world)
        assert result["row_diff"] < 1e-5
        assert result["row_ranks_identical"]
        assert result["mlp_diff"] < 1e-6


def stage_matches_serial():
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    stage = TransformerStage(32, depth=1, dim_head=8, local_window=2, global_window=2,
                             ff_mult=2, attn_dropout=0.0, ff_dropout=0.0)
    serial = copy.deepcopy(stage)
    blocks = apply_native_tensor_parallel(stage, mesh)
    x = torch.randn(2, 32, 4, 8, generator=torch.Generator().manual_seed(1))
    out, ref = stage(x), serial(x)
    out.square().mean().backward()
    ref.square().mean().backward()
    grads = dict(serial.named_parameters())
    worst, missing, sharded = 0.0, [], 0
    for name, p in stage.named_parameters():
        if p.grad is None:
            missing.append(name)
            continue
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        scale = grads[name].grad.abs().max().item() + 1e-12
        worst = max(worst, (g - grads[name].grad).abs().max().item() / scale)
        if isinstance(p, DTensor) and any(isinstance(pl, Shard) for pl in p.placements):
            sharded += 1
    return {
        "blocks": blocks,
        "forward_diff": (out - ref).abs().max().item(),
        "grad_rel_diff": worst,
        "missing": missing,
        "sharded": sharded,
    }


@pytest.mark.parametrize("world", [2, 4])
def test_wxformer_stage_matches_serial(world):
    """Forward within 1e-6 absolute, gradients within 1e-5 of each tensor's largest entry
    (float32 reassociation in the row-parallel reduction is the only difference)."""
    for result in run_ranks(stage_matches_serial, world):
        assert result["blocks"] == 4  # local attention, ff, global attention, ff
        assert result["forward_diff"] < 1e-6
        assert result["grad_rel_diff"] < 1e-5
        assert result["missing"] == []
        # per round: q, k, v, out weights of 2 attentions + up weight, up bias, down weight of 2 ffs
        assert result["sharded"] == 2 * 4 + 2 * 3


def mixed_mesh_clip():
    mesh = build_device_mesh(resolve_layout(4, "fsdp2", 2), "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(
        TransformerStage(16, depth=1, dim_head=8, local_window=2, global_window=2,
                         ff_mult=2, attn_dropout=0.0, ff_dropout=0.0),
        nn.Conv2d(16, 4, 1),
    )
    model._shard_units = ("0", "1")  # the stage and the conv are the units
    parallelize_model(model, mesh, "fsdp2")
    x = torch.randn(2, 16, 4, 4, generator=torch.Generator().manual_seed(mesh["dp"].get_local_rank()))
    model(x).square().mean().backward()
    params = [p for p in model.parameters() if p.grad is not None]
    meshes = {p.grad.device_mesh.mesh_dim_names for p in params}
    full = [p.grad.full_tensor() for p in params]
    torch_rejects = False
    try:
        torch.nn.utils.clip_grad_norm_([copy.deepcopy(p.grad) for p in params], 1e9)
    except Exception:
        torch_rejects = True
    expected = torch.nn.utils.get_total_norm(full)
    max_norm = expected.item() / 4
    copies = []  # parameters holding a copy of each gradient, for torch's own clipping
    for p in params:
        copies.append(nn.Parameter(p.detach().clone()))
        copies[-1].grad = DTensor.from_local(p.grad.to_local().clone(), p.grad.device_mesh, p.grad.placements,
                                             run_check=False, shape=p.grad.shape, stride=p.grad.stride())
    norm = clip_grad_norm_(params, max_norm)
    after = total_grad_norm([p.grad for p in params])
    # the local scaling gives the bits of torch's own scaling of each mesh's DTensor gradients
    for mesh_names in meshes:
        torch.nn.utils.clip_grads_with_norm_(
            [c for c in copies if c.grad.device_mesh.mesh_dim_names == mesh_names], max_norm, norm)
    same_bits = all(torch.equal(c.grad.full_tensor(), p.grad.full_tensor()) for c, p in zip(copies, params))
    return {
        "meshes": sorted(meshes),
        "torch_rejects": torch_rejects,
        "norm": norm.item(),
        "expected": expected.item(),
        "plain": not isinstance(norm, DTensor),
        "after": after.item(),
        "max_norm": max_norm,
        "same_bits": same_bits,
    }


def test_mixed_mesh_clip_matches_torch_on_materialized_grads():
    eps = torch.finfo(torch.float32).eps
    for result in run_ranks(mixed_mesh_clip, 4):
        # norms on dp, projections on (dp, tp), the conv (no tp parameters) on all ranks
        assert result["meshes"] == [("dp",), ("dp", "tp"), ("dp_tp",)]
        assert result["torch_rejects"]
        assert result["plain"]
        assert abs(result["norm"] - result["expected"]) <= 8 * eps * result["expected"]
        assert result["after"] == pytest.approx(result["max_norm"], rel=1e-5)
        assert result["same_bits"]


def ema_on_shards() -> dict:
    """EMA of a tp-split, fully_shard-ed model: the update on each shadow's local values
    against the same arithmetic through DTensor's own ops, and a plain model's update
    against the formula, after one step."""
    from credit.models.ema import EMA

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = nn.Sequential(
        TransformerStage(16, depth=1, dim_head=8, local_window=2, global_window=2,
                         ff_mult=2, attn_dropout=0.0, ff_dropout=0.0),
        nn.Conv2d(16, 4, 1),
    )
    model._shard_units = ("0", "1")
    parallelize_model(model, mesh, "fsdp2")
    ema = EMA(model, decay=0.9)
    reference = {name: copy.deepcopy(s) for name, s in ema.shadow.items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ema.update(model)
    for name, p in model.named_parameters():
        reference[name].add_((p.detach() - reference[name]) * (1.0 - 0.9))
    sharded = all(isinstance(s, DTensor) for s in ema.shadow.values())
    same = all(torch.equal(ema.shadow[n].full_tensor(), reference[n].full_tensor()) for n in reference)
    moved = all(not torch.equal(ema.shadow[n].full_tensor(), p.full_tensor()) for n, p in model.named_parameters())
    return {"sharded": sharded, "same": same, "moved": moved}


def test_ema_on_local_shards_gives_dtensor_arithmetic_bits():
    for result in run_ranks(ema_on_shards, 4):
        assert result["sharded"] and result["moved"]
        assert result["same"]


def test_ema_of_a_plain_model_follows_the_formula_bitwise():
    from credit.models.ema import EMA

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Linear(7, 3))
    ema = EMA(model, decay=0.99)
    before = {n: s.clone() for n, s in ema.shadow.items()}
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5).add_(0.25)
    ema.update(model)
    for name, p in model.named_parameters():
        expected = before[name] + (p.detach() - before[name]) * (1.0 - 0.99)
        assert torch.equal(ema.shadow[name], expected)
        assert not torch.equal(ema.shadow[name], before[name])
