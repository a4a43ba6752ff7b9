"""Two-stage seeding and the sampler contract on real (dp, tp) meshes."""

import torch
import torch.nn.functional as F
from launcher import run_ranks
from test_distributed_training import _full_weights, _trainer
from tiny import tiny_overrides


def inspect_layout(overrides):
    trainer = _trainer(overrides)
    model, _ = _full_weights(trainer)
    mesh = trainer.runtime.mesh
    mask = F.dropout(torch.ones(256), p=0.5)  # runtime RNG after stage-2 seeding
    batches = [indices for _, (_, _, indices) in zip(range(3), trainer.sampler.iterate_forever())]
    return {
        "coords": (mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()),
        "weights": model,
        "mask": mask,
        "batches": batches,
    }


def _by_coords(results):
    return {r["coords"]: r for r in results}


def test_seeding_and_sampler_contract(tiny_data, tmp_path):
    base = tiny_overrides(tiny_data, "trainer.batch_size=2", "trainer.resume=never")
    grid = _by_coords(run_ranks(inspect_layout, 4, [*base, "parallelism=fsdp2_tp2",
                                                      f"run_dir={tmp_path / 'a'}"]))
    flat = _by_coords(run_ranks(inspect_layout, 4, [*base, "parallelism=fsdp2",
                                                      f"run_dir={tmp_path / 'b'}"]))
    serial = _trainer([*base, "parallelism=single", f"run_dir={tmp_path / 'c'}"])

    # stage 1: the full weights at init are the same whatever the layout
    reference = serial.model.state_dict()
    for weights in (grid[(0, 0)]["weights"], flat[(0, 0)]["weights"]):
        assert weights.keys() == reference.keys()
        assert all(torch.equal(weights[k], v) for k, v in reference.items())

    # stage 2: tp peers share runtime randomness, dp replicas do not
    assert torch.equal(grid[(0, 0)]["mask"], grid[(0, 1)]["mask"])
    assert torch.equal(grid[(1, 0)]["mask"], grid[(1, 1)]["mask"])
    assert not torch.equal(grid[(0, 0)]["mask"], grid[(1, 0)]["mask"])

    # sampler: ranks differing only in tp get identical batches; dp ranks get disjoint ones
    assert grid[(0, 0)]["batches"] == grid[(0, 1)]["batches"]
    assert grid[(1, 0)]["batches"] == grid[(1, 1)]["batches"]
    for b0, b1 in zip(grid[(0, 0)]["batches"], grid[(1, 0)]["batches"]):
        assert not set(b0) & set(b1)
    # one global sample order whatever the layout: dp2's first global batch is the first
    # half of dp4's
    first_grid = grid[(0, 0)]["batches"][0] + grid[(1, 0)]["batches"][0]
    assert first_grid == flat[(0, 0)]["batches"][0] + flat[(1, 0)]["batches"][0]
