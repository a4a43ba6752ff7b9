"""Process groups are device-aware, and every collective gets a tensor on the run's device.

NCCL takes CUDA tensors only. A run on GPUs joins "cpu:gloo,cuda:nccl" groups (host
tensors through gloo), and credit's own collectives hand over tensors made on the run's
device. The second half is pinned here on CPU with real gloo ranks running the real
trainer: `collective_recorder` flags any tensor that reaches a collective after being
made without `device=` (it would be a host tensor on a GPU run).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from collective_recorder import CollectiveRecorder
from launcher import run_ranks
from tiny import tiny_overrides

from credit.config import compose_config
from credit.parallel import build_runtime
from credit.parallel.mesh import process_group_backend
from credit.train.trainer import Trainer

# collectives every rank must have made from credit's own code in the runs below
EXPECTED_SITES = {
    ("all_reduce", "credit/train/step.py:step_loss"),  # fast-mode loss average over dp
    ("all_reduce", "credit/train/trainer.py:_report_skipped"),  # data.nonfinite=skip_sample count
    ("all_gather", "credit/train/deterministic.py:global_loss"),  # per-sample loss tree
    ("all_to_all_single", "credit/parallel/tree_reduce.py:__call__"),  # det FSDP2 gradients
    # SDC checksums (credit.compat.all_gather_single: torch < 2.13 has the older name only)
    ("all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor",
     "credit/diagnostics/detector.py:end_step"),
    ("barrier", "credit/checkpoint/manager.py:_barrier"),
}


def test_the_backend_is_device_aware():
    assert process_group_backend(torch.device("cuda", 0)) == "cpu:gloo,cuda:nccl"
    assert process_group_backend(torch.device("cpu")) == "gloo"


def _train(overrides: list[str]) -> None:
    cfg = compose_config(overrides)
    trainer = Trainer(cfg, build_runtime(cfg))
    trainer.setup()
    trainer.fit()


def record_runs(base: list[str], root: str) -> dict:
    recorder = CollectiveRecorder().install()
    try:
        # the recorder sees the bug it exists for: a host-made tensor in a collective
        dist.all_reduce(torch.tensor([1.0]))
        planted = recorder.calls.pop()
        dist.all_reduce(torch.tensor([1.0]).to(torch.device("cpu")))
        placed = recorder.calls.pop()
        fast = [*base, "trainer.max_steps=2", "trainer.checkpoint.every_n_steps=2",
                "data.nonfinite=skip_sample", "diagnostics.sdc.enabled=true",
                "diagnostics.sdc.every_n_steps=1"]
        _train([*fast, f"run_dir={root}/fast"])
        _train([*fast, f"run_dir={root}/fast", "trainer.max_steps=3"])  # resumes from DCP
        _train([*base, f"run_dir={root}/det", "model.gemm=deterministic", "model.dim=[64,64]",
                "model.dim_head=16", "trainer.max_steps=2",
                "trainer.checkpoint.every_n_steps=0"])
    finally:
        recorder.uninstall()
    return {"calls": recorder.calls, "planted": planted, "placed": placed}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, tiny_data):
    root = tmp_path_factory.mktemp("collectives")
    base = tiny_overrides(tiny_data, "trainer.batch_size=2", "data.valid_samples=4",
                          "parallelism=fsdp2_tp2", "trainer.valid_every_n_steps=0")
    return run_ranks(record_runs, 4, base, str(root))


def test_the_recorder_flags_a_host_made_tensor(recorded):
    for rank in recorded:
        assert rank["planted"].host_made
        assert not rank["placed"].host_made


def test_every_collective_tensor_is_on_the_run_device(recorded):
    for rank, result in enumerate(recorded):
        calls = result["calls"]
        sites = {(c.op, c.site) for c in calls}
        missing = EXPECTED_SITES - sites
        assert not missing, f"rank {rank}: expected collectives not seen: {sorted(missing)}"
        assert sum(c.site == "torch" for c in calls) > 10  # FSDP2 / DCP collectives recorded too
        for call in calls:
            assert call.backend == "gloo", call
            assert set(call.devices) <= {"cpu"}, call
            assert not call.host_made, f"rank {rank}: {call} got a tensor made without device="
