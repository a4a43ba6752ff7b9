"""`benchmarks/determinism.py --profile`'s accounting (benchmarks/op_families.py): a real train
step of the older CrossFormer with spectral norm, under torch.profiler, split by family."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from credit.config import compose_config
from credit.parallel import build_runtime
from credit.train.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from op_families import FAMILIES, PREFIX, UNLINKED, family_ranges, profile_step  # noqa: E402


@pytest.mark.parametrize("gemm", ["deterministic", "fast"])
def test_every_family_of_the_model_gets_its_time_and_nothing_is_counted_twice(tiny_data, tmp_path, gemm):
    from tiny import tiny_data_overrides

    cfg = compose_config(tiny_data_overrides(
        tiny_data, f"run_dir={tmp_path}", "model=crossformer", "model.dim=[8,16,32,64]", "model.dim_head=4",
        "model.use_spectral_norm=true", "model.ff_dropout=0.1", f"model.gemm={gemm}", "trainer.batch_size=2",
        "trainer.device=cpu", "trainer.progress_bar=false"))
    trainer = Trainer(cfg, build_runtime(cfg))
    trainer.setup()
    batches = iter(trainer.loader)
    trainer.train_step(batches)
    profiled = profile_step(trainer, batches)
    assert list(profiled) == ["host"]  # no device table on the CPU
    times = profiled["host"]
    assert list(times) == list(FAMILIES)
    for family in ("projections", "convolutions", "norms", "position bias", "attention (rest)", "spectral norm",
                   "dropout masks", "optimizer and clipping", "data loading"):
        assert times[family] > 0, (family, times)
    assert times["collectives"] == 0  # one process

    # the families split the profiled events' own time: their sum is the events' total
    from torch.profiler import ProfilerActivity, profile

    from op_families import family_times

    with family_ranges(trainer), profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.train_step(batches)
    events = prof.events()
    total = sum(e.self_cpu_time_total for e in events if not e.name.startswith(PREFIX)) / 1e3
    assert sum(family_times(events).values()) == pytest.approx(total, rel=1e-9)
    # the device clock on a CPU run: no kernels, every row zero, the unlinked row included
    device = family_times(events, "device")
    assert list(device) == [*FAMILIES, UNLINKED] and not any(device.values())
    # the hooks and patches are gone after the context
    assert not any(m._forward_pre_hooks for m in trainer.model.modules())
