"""The replica check on 4 real gloo ranks at tp=4 (one tp group of four): a bit flipped in
one rank's copy of a tp-replicated parameter after the step is reported on that rank,
also when the rank is 0 (the modal value is the reference); an intact model reports
nothing. Under ddp at dp2 x tp2 the four copies outvote one; under fsdp2 a dp shard has two
copies (tp peers) and no majority: both ranks are named as candidates."""

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from parallel.launcher import run_ranks
from torch.distributed.device_mesh import init_device_mesh

from credit.config.schema import SDCConfig


def _replica_verdicts(tp: int, data: str, corrupt_ranks: list):
    from credit.diagnostics import SDCDetector
    from credit.diagnostics.checksum import flip_bit, local
    from credit.models.build import build_model
    from credit.parallel import parallelize_model
    from tiny import SMALL_MODEL

    torch.manual_seed(0)
    model = build_model(dict(SMALL_MODEL, dim_head=4), in_channels=11, out_channels=9, state_channels=9,
                        history_len=1, grid=(16, 32))
    sdc = OmegaConf.structured(SDCConfig(enabled=True, every_n_steps=1, checks=["replica"]))
    world = dist.get_world_size()
    detector = SDCDetector(sdc, deterministic=False, run_dir="/nonexistent", rank=dist.get_rank(),
                           world_size=world, device=torch.device("cpu"))
    mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
    parallelize_model(model, mesh, data)
    detector.attach(model)
    detector.rank = 1  # only rank 0 writes sdc.jsonl; this test reads the reports instead
    norm = model.get_submodule("stages.0.layers.0.1.norm")  # tp-replicated in a tp block
    verdicts = []
    for step, corrupt in enumerate(corrupt_ranks, start=1):
        detector.begin_step(step)
        if dist.get_rank() == corrupt:
            flip_bit(local(norm.weight), 5, 27)
        report = detector.end_step()
        if dist.get_rank() == corrupt:
            flip_bit(local(norm.weight), 5, 27)  # restored for the next case
        verdicts.append((report.layers_verified, [(m.rank, m.layer, m.check, m.path, m.expected is None)
                                                  for m in report.mismatches]))
    return verdicts


def test_replica_check_names_the_diverged_rank():
    cases = [None, 2, 0]
    results = run_ranks(_replica_verdicts, 4, 4, "none", cases)
    assert all(r == results[0] for r in results)  # every rank reached the same verdicts
    for corrupt, (verified, found) in zip(cases, results[0]):
        assert verified > 0
        expected = [] if corrupt is None else [(corrupt, "stages.0.layers.0.1.norm", "replica", "state", False)]
        assert found == expected


def test_dp_replicas_vote_and_two_copies_name_both_candidates():
    # ddp at dp2 x tp2: the norm is held by all four ranks, so rank 3 is outvoted
    ((verified, found),), *_ = run_ranks(_replica_verdicts, 4, 2, "ddp", [3])
    assert verified > 0
    assert found == [(3, "stages.0.layers.0.1.norm", "replica", "state", False)]
    # fsdp2: each dp shard of the norm has two copies (tp peers): no majority, both named
    ((verified, found),), *_ = run_ranks(_replica_verdicts, 4, 2, "fsdp2", [3])
    assert verified > 0
    assert found == [(2, "stages.0.layers.0.1.norm", "replica", "state", True),
                     (3, "stages.0.layers.0.1.norm", "replica", "state", True)]
