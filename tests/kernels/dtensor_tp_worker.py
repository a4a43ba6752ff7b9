"""Two-rank (gloo, CPU) tensor-parallel run of DetLinear layers.

Launched by test_gemm_dtensor.py.  Each rank builds the same two-layer MLP,
keeps an unsharded copy, shards the original with ColwiseParallel (fc1) and
RowwiseParallel (fc2), and compares outputs and gradients bitwise.  Rank 0
prints a JSON object: check name -> "ok" or the failure text.
"""

import copy
import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


class MLP(nn.Module):
    _tp_plan = {"fc1": "colwise", "fc2": "rowwise"}

    def __init__(self, bias: bool):
        super().__init__()
        from credit.kernels.gemm import DetLinear
        from credit.models.layer_kit import mark_whole_reductions

        self.fc1 = DetLinear(64, 128, bias=bias)
        self.fc2 = DetLinear(128, 64, bias=bias)
        mark_whole_reductions(self)  # fc1's K and fc2's input-gradient N stay whole

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def run_checks(rank: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    import gemm_checks as C
    from credit.kernels.gemm import DetLinear, det_mm

    mesh = init_device_mesh("cpu", (2,))
    results = {}

    def check(name, fn):
        try:
            fn()
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc(limit=4)

    def tp_matches_unsharded(bias: bool):
        torch.manual_seed(0)
        model = MLP(bias)
        ref = copy.deepcopy(model)
        parallelize_module(model, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        assert isinstance(model.fc1.weight, DTensor)
        x = C.rand(3, 10, 64, dtype=torch.float32, device="cpu", seed=80)
        xs, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        y, y_ref = model(xs), ref(xr)
        assert not isinstance(y, DTensor)  # RowwiseParallel hands back a local tensor
        C.same(y, y_ref, "TP output vs unsharded")
        g = C.rand(3, 10, 64, dtype=torch.float32, device="cpu", seed=81)
        y.backward(g)
        y_ref.backward(g)
        C.same(xs.grad, xr.grad, "input grad")
        for name, p in model.named_parameters():
            full = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            C.same(full, dict(ref.named_parameters())[name].grad, f"{name}.grad")

    def rejects_whole_reductions_that_are_split():
        torch.manual_seed(0)
        model = MLP(True)
        assert model.fc1.whole_reductions == (True, False) and model.fc2.whole_reductions == (False, True)
        parallelize_module(model, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        x = C.rand(3, 64, dtype=torch.float32, device="cpu", seed=82)
        for layer, wrong in ((model.fc1, (True, True)), (model.fc2, (True, True))):
            saved, layer.whole_reductions = layer.whole_reductions, wrong
            try:
                model(x)
            except ValueError as exc:
                assert "whole_reductions" in str(exc), exc
            else:
                raise AssertionError(f"a split reduction marked whole was accepted: {wrong}")
            finally:
                layer.whole_reductions = saved
        model(x)  # the plan's own marks pass

    def rejects_unsupported():
        w = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])
        try:
            det_mm(torch.randn(2, 8), w)
        except TypeError as exc:
            assert "DTensor" in str(exc)
        else:
            raise AssertionError("det_mm accepted a DTensor")
        layer = DetLinear(4, 6)
        x = distribute_tensor(torch.randn(5, 4), mesh, [Shard(0)])
        try:
            layer(x)
        except TypeError as exc:
            assert "plain weight" in str(exc)
        else:
            raise AssertionError("DetLinear accepted a DTensor input with a plain weight")

    check("tp_matches_unsharded_bias", lambda: tp_matches_unsharded(True))
    check("tp_matches_unsharded_nobias", lambda: tp_matches_unsharded(False))
    check("rejects_unsupported", rejects_unsupported)
    check("rejects_whole_reductions_that_are_split", rejects_whole_reductions_that_are_split)
    return results


def worker(rank: int, world: int, init_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        results = run_checks(rank)
        gathered = [None] * world
        dist.all_gather_object(gathered, results)
        if rank == 0:
            merged = {k: next((r[k] for r in gathered if r[k] != "ok"), "ok") for k in results}
            print(json.dumps(merged), flush=True)
        dist.barrier()  # no rank tears gloo down while a peer still talks to it
    finally:
        dist.destroy_process_group()
    # the work and the teardown finished: a crash after this (gloo's threads at interpreter
    # exit, "terminate called without an active exception") is not what the test examines
    Path(f"{init_file}.done{rank}").write_text("")


if __name__ == "__main__":
    mp.spawn(worker, args=(2, sys.argv[1]), nprocs=2, join=True)
