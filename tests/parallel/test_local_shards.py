"""`map_shards` gives the DTensor that DTensor's own op gives (layout and bits), without
DTensor's sharding propagation (a pending sum excepted); EMA copies and optimizer state are
made that way."""

import torch
from launcher import run_ranks

from credit.parallel.local_shards import local_values, map_shards


def _layouts_and_propagations() -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    g = torch.Generator().manual_seed(0)
    tensors = [distribute_tensor(torch.randn(37, 5, generator=g), mesh, [Shard(0)]),  # uneven shards
               distribute_tensor(torch.randn(6, 9, generator=g).t(), mesh, [Shard(1)]),  # not contiguous
               distribute_tensor(torch.randn(129, generator=g), mesh, [Replicate()]),
               DTensor.from_local(torch.randn(4, 3, generator=g), mesh, [Partial()], run_check=False)]
    propagator = DTensor._op_dispatcher.sharding_propagator
    calls = []
    slow = propagator.propagate_op_sharding_non_cached
    propagator.propagate_op_sharding_non_cached = lambda *a, **k: calls.append(1) or slow(*a, **k)
    try:
        mismatches = []
        for t in tensors:
            for op in (torch.clone, torch.zeros_like):
                before = len(calls)
                ours = map_shards(t, op)
                ours_calls = len(calls) - before
                ref = op(t)
                same = (ours.placements == ref.placements and ours.shape == ref.shape and ours.stride() == ref.stride()
                        and ours.to_local().stride() == ref.to_local().stride()
                        and torch.equal(ours.to_local(), ref.to_local())
                        and ours.to_local().data_ptr() != t.to_local().data_ptr())
                pending = t.placements[0].is_partial()  # DTensor's own op: it reduces the sum first
                if not same or (ours_calls > 0) != pending:
                    mismatches.append((op.__name__, tuple(t.placements), ours_calls))
        before = len(calls)
        local_values(tensors[0]).mul_(0.5)  # in place on the DTensor itself
        scaled = tensors[0].full_tensor()
        after_local = len(calls) - before
    finally:
        propagator.propagate_op_sharding_non_cached = slow
    g = torch.Generator().manual_seed(0)
    return dict(mismatches=mismatches, propagations=after_local,
                scaled=torch.equal(scaled, torch.randn(37, 5, generator=g) * 0.5))


def test_map_shards_is_dtensors_own_op_without_its_propagation():
    for result in run_ranks(_layouts_and_propagations, 2):
        assert result["mismatches"] == [], result["mismatches"]
        assert result["scaled"] and result["propagations"] == 0


def test_plain_tensors_pass_through():
    t = torch.arange(6.0).reshape(2, 3).t()
    assert local_values(t) is t
    copy = map_shards(t, torch.clone)
    assert torch.equal(copy, t) and copy.stride() == t.stride() and copy.data_ptr() != t.data_ptr()
