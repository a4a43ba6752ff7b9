"""Two-stage seeding and the sampler contract on real (dp, tp) meshes."""

import torch
from launcher import run_ranks
from test_distributed_training import _full_weights, _trainer
from tiny import tiny_overrides


def inspect_layout(overrides):
    trainer = _trainer(overrides)
    model, _ = _full_weights(trainer)
    mesh = trainer.runtime.mesh
    batches = [indices for _, (_, _, indices) in zip(range(3), trainer.sampler.iterate_forever())]
    # the feed-forward dropout masks of two real training steps (stage-2 seeding)
    masks = []
    dropout = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.Dropout))
    dropout.register_forward_hook(
        lambda module, inputs, output: masks.append((output == 0) & (inputs[0] != 0)))
    stream = iter(trainer.loader)
    for _ in range(2):
        trainer.train_step(stream)
    return {
        "coords": (mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()),
        "weights": model,
        "masks": masks,
        "batches": batches,
    }


def _by_coords(results):
    return {r["coords"]: r for r in results}


def test_seeding_and_sampler_contract(tiny_data, tmp_path):
    base = tiny_overrides(tiny_data, "trainer.batch_size=2", "trainer.resume=never",
                          "model.ff_dropout=0.5")
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

    # stage 2, during training: tp peers draw the same dropout masks, dp replicas and
    # successive steps do not
    for dp in (0, 1):
        masks, peer = grid[(dp, 0)]["masks"], grid[(dp, 1)]["masks"]
        assert len(masks) == 2 and all(m.float().mean() > 0.3 for m in masks)
        assert all(torch.equal(a, b) for a, b in zip(masks, peer))
        assert not torch.equal(masks[0], masks[1])
    assert not torch.equal(grid[(0, 0)]["masks"][0], grid[(1, 0)]["masks"][0])

    # sampler: ranks differing only in tp get identical batches; dp ranks get disjoint ones
    assert grid[(0, 0)]["batches"] == grid[(0, 1)]["batches"]
    assert grid[(1, 0)]["batches"] == grid[(1, 1)]["batches"]
    for b0, b1 in zip(grid[(0, 0)]["batches"], grid[(1, 0)]["batches"]):
        assert not set(b0) & set(b1)
    # one global sample order whatever the layout: dp2's first global batch is the first
    # half of dp4's
    first_grid = grid[(0, 0)]["batches"][0] + grid[(1, 0)]["batches"][0]
    assert first_grid == flat[(0, 0)]["batches"][0] + flat[(1, 0)]["batches"][0]
