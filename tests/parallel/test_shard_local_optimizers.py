"""Both AdamWs update DTensor parameters through their local shards with the bits of the
DTensor ops, and ShardLocalAdamW is torch's AdamW (same results, same state dict)."""

import pytest
import torch
from launcher import run_ranks

from credit.train.elementwise_adamw import ElementwiseAdamW
from credit.train.shard_local import ShardLocalAdamW

HYPER = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
SHAPES = ((37, 5), (129,), (3, 4, 5))


def _grads(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(shape, generator=g) for shape in SHAPES]


def _plain_run(cls, steps=4, **extra) -> tuple[list[torch.Tensor], dict]:
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in SHAPES]
    opt = cls(params, **HYPER, **extra)
    for group in opt.param_groups:
        group["foreach"] = True
    for step in range(steps):
        for p, grad in zip(params, _grads(step)):
            p.grad = grad
        opt.step()
    return [p.detach().clone() for p in params], opt.state_dict()


@pytest.mark.parametrize("amsgrad", [False, True])
def test_shard_local_adamw_is_torch_adamw_bitwise(amsgrad):
    ours, ours_state = _plain_run(ShardLocalAdamW, amsgrad=amsgrad)
    ref, ref_state = _plain_run(torch.optim.AdamW, amsgrad=amsgrad)
    for a, b in zip(ours, ref):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    assert ours_state["state"].keys() == ref_state["state"].keys()
    for k, state in ref_state["state"].items():
        assert state.keys() == ours_state["state"][k].keys()
        for name, value in state.items():
            assert value.dtype == ours_state["state"][k][name].dtype and torch.equal(value, ours_state["state"][k][name])
    # a state dict saved by either loads into the other and continues with the same bits
    params = [torch.nn.Parameter(p.clone()) for p in ours]
    resumed = ShardLocalAdamW(params, **HYPER, amsgrad=amsgrad)
    resumed.load_state_dict(ref_state)
    again = torch.optim.AdamW([torch.nn.Parameter(p.clone()) for p in ref], **HYPER, amsgrad=amsgrad)
    again.load_state_dict(ours_state)
    for opt in (resumed, again):
        for group in opt.param_groups:
            group["foreach"] = True
        for p, grad in zip(opt.param_groups[0]["params"], _grads(9)):
            p.grad = grad
        opt.step()
    for a, b in zip(resumed.param_groups[0]["params"], again.param_groups[0]["params"]):
        assert torch.equal(a.detach(), b.detach())


def _dtensor_updates(kind: str) -> dict[str, list[torch.Tensor]]:
    """On 2 ranks: ours with DTensor parameters (sharded, replicated, a pending-sum gradient)
    against the reference optimizer on the same DTensors forced through DTensor ops."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    layouts = [[Shard(0)], [Replicate()], [Shard(0)]]

    def build():
        g = torch.Generator().manual_seed(0)
        return [torch.nn.Parameter(distribute_tensor(torch.randn(shape, generator=g), mesh, placement))
                for shape, placement in zip(SHAPES, layouts)]

    def grads(step):
        out = []
        for k, (grad, placement) in enumerate(zip(_grads(step), layouts)):
            if k == 1:  # a Replicate parameter whose gradient still awaits its sum over dp
                out.append(DTensor.from_local(grad / 2, mesh, [Partial()], run_check=False))
            else:
                out.append(distribute_tensor(grad, mesh, placement))
        return out

    results = {}
    for name in ("ours", "ref"):
        # fast: torch's AdamW on the same DTensors (DTensor ops); deterministic: the update on
        # whole plain tensors, which the single-rounding ops give in every layout
        plain = name == "ref" and kind == "deterministic"
        if plain:
            g = torch.Generator().manual_seed(0)
            params = [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in SHAPES]
        else:
            params = build()
        cls = {("fast", "ours"): ShardLocalAdamW, ("fast", "ref"): torch.optim.AdamW}.get((kind, name),
                                                                                         ElementwiseAdamW)
        opt = cls(params, **HYPER)
        for group in opt.param_groups:
            group["foreach"] = name == "ours"  # the reference: DTensor ops one parameter at a time
        for step in range(3):
            for p, grad in zip(params, _grads(step) if plain else grads(step)):
                p.grad = grad
            opt.step()
        results[name] = [p.detach().clone() if plain else p.full_tensor() for p in params]
        if not plain:
            assert all(isinstance(opt.state[p]["exp_avg"], DTensor) for p in params)  # state stays DTensor
    return results


@pytest.mark.parametrize("kind", ["fast", "deterministic"])
def test_dtensor_parameters_get_the_bits_of_dtensor_ops(kind):
    for rank_result in run_ranks(_dtensor_updates, 2, kind):
        for a, b in zip(rank_result["ours"], rank_result["ref"]):
            assert torch.equal(a, b)


@pytest.mark.parametrize("cls, extra", [(ShardLocalAdamW, {}), (ShardLocalAdamW, {"amsgrad": True}),
                                        (ElementwiseAdamW, {})])
def test_init_state_makes_the_first_steps_state_for_the_parameters_that_train(cls, extra):
    """`credit plan` holds the optimizer state without a step: the same entries the first step
    makes (a frozen parameter none), and a step after it gives the bits of a step without it."""
    runs = []
    for init in (False, True):
        g = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in SHAPES]
        params[1].requires_grad_(False)
        opt = cls(params, **HYPER, **extra)
        if init:
            opt.init_state()
            made = {k: {n: (v.dtype, v.shape, float(v.abs().sum())) for n, v in s.items()}
                    for k, s in opt.state_dict()["state"].items()}
        for p, grad in zip(params, _grads(0)):
            if p.requires_grad:
                p.grad = grad
        opt.step()
        runs.append((params, opt.state_dict()["state"]))
    (ref, ref_state), (ours, ours_state) = runs
    assert made.keys() == ref_state.keys() == {0, 2}  # the frozen parameter has none
    for k, state in ref_state.items():
        assert made[k] == {n: (v.dtype, v.shape, 0.0) for n, v in state.items()}
        assert all(torch.equal(v, ours_state[k][n]) for n, v in state.items())
    assert all(torch.equal(a, b) for a, b in zip(ref, ours))
