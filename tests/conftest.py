"""Shared fixtures: a tiny real dataset in ERA5 layout, and config overrides sized for it."""

import gc
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from tiny import TINY_LEVELS, tiny_overrides as _tiny_overrides

from credit.data import generate_dataset


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """Two 12-day 'years' on a 16x32 grid with two levels: real netCDF files."""
    root = tmp_path_factory.mktemp("tiny_era5")
    generate_dataset(
        root,
        grid=(16, 32),
        years=[2000, 2001],
        levels=TINY_LEVELS,
        train_years=[2000],
        days_per_year=12,
        progress=False,
        overwrite=True,
    )
    return root


@pytest.fixture
def year_free_tmp_path(tmp_path):
    """pytest's folder, or a fresh one when its path holds four digits in a row: CREDIT's gen1
    year filter reads a year anywhere in a path (`generate_like_gen1` refuses an --out that
    would mislead it), and pytest's numbered folders (pytest-N) reach years in time."""
    if not re.search(r"\d{4}", str(tmp_path)):
        yield tmp_path
        return
    base = Path(tempfile.mkdtemp(prefix="credit_like_"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def tiny_overrides(tiny_data):
    """Overrides for a seconds-long training run on `tiny_data` writing to `run_dir`."""

    def make(run_dir: Path, *extra: str) -> list[str]:
        return _tiny_overrides(tiny_data, f"run_dir={run_dir}", *extra)

    return make


# The quick tier (`make test-quick`: `-m "not heavy"`) is every test outside these files,
# which launch ranks or train for tens of seconds; tests/parallel/test_smoke.py is its one
# multi-rank test. A path listed here that no longer exists stops the collection.
HEAVY = {
    "checkpoint/test_credit_start.py",
    "config/test_credit_gen2_config.py",
    "config/test_credit_like.py",
    "config/test_credit_smoke_files.py",
    "diagnostics/test_sdc_replica.py",
    "diagnostics/test_sdc_training.py",
    "kernels/test_gemm_cpu_isa.py",
    "manual/test_gpu_kit.py",
    "parallel/test_clip_and_layout.py",
    "parallel/test_collective_devices.py",
    "parallel/test_credit_config_layouts.py",
    "parallel/test_credit_deterministic_tp.py",
    "parallel/test_credit_parity.py",
    "parallel/test_credit_resume.py",
    "parallel/test_credit_tp.py",
    "parallel/test_deterministic_tp.py",
    "parallel/test_distributed_training.py",
    "parallel/test_launch_context.py",
    "parallel/test_launcher_death.py",
    "parallel/test_seeding_and_sampling.py",
    "parallel/test_sequence_parallel.py",
    "parallel/test_sequence_parallel_training.py",
    "parallel/test_shard_local_optimizers.py",
    "parallel/test_spectral_norm_tp.py",
    "parallel/test_tp_numerics.py",
    "parallel/test_tp_parity_acceptance.py",
    "parallel/test_tp_plans_and_options.py",
    "plan/test_plan_command.py",
    "plan/test_plan_estimates.py",
    "rollout/test_default_skill.py",
    "rollout/test_tp_parity.py",
    "train/test_credit_deterministic_training.py",
    "train/test_deterministic_training.py",
    "train/test_hardening.py",
    "train/test_learned_variance.py",
    "train/test_memory_metrics.py",
    "train/test_post_blocks.py",
    "train/test_spectral_norm_training.py",
    "test_other_cpu_path.py",
}


# The longest files (minutes each on 2 cores), collected first: pytest-xdist's loadfile hands
# out files in collection order (with its reordering by test count turned off, below), so the
# two workers start on these and end together instead of one worker starting a ten-minute file
# last.
LONGEST_FIRST = (  # by their summed durations, over 20 s, in a clean-clone run (Intel Xeon VM, 2026-12-04)
    "train/test_deterministic_training.py",
    "manual/test_gpu_kit.py",
    "rollout/test_default_skill.py",
    "config/test_credit_like.py",
    "parallel/test_credit_config_layouts.py",
    "config/test_credit_smoke_files.py",
    "test_other_cpu_path.py",
    "parallel/test_sequence_parallel.py",
    "plan/test_plan_estimates.py",
    "diagnostics/test_sdc_training.py",
    "train/test_ensemble_axis.py",
    "parallel/test_distributed_training.py",
    "parallel/test_launcher_death.py",
    "train/test_credit_deterministic_training.py",
    "parallel/test_credit_tp.py",
    "parallel/test_tp_parity_acceptance.py",
    "parallel/test_spectral_norm_tp.py",
    "plan/test_plan_command.py",
    "parallel/test_sequence_parallel_training.py",
    "parallel/test_credit_resume.py",
    "kernels/test_gemm_gpu.py",
    "parallel/test_smoke.py",
    "kernels/test_gemm_cpu_isa.py",  # last of these: the guard (above) builds the scalar GEMM it loads
)


def pytest_configure(config):
    # pytest-xdist >= 3.7 sorts loadfile's files by their number of tests (most first) unless
    # told not to: the many-parametrized quick files would then go first and the long
    # single-test files last, one worker running alone at the end
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    root = Path(__file__).parent
    missing = sorted(p for p in (*HEAVY, *LONGEST_FIRST) if not (root / p).is_file())
    if missing:
        raise pytest.UsageError(f"tests/conftest.py HEAVY names files that do not exist: {missing}")
    for item in items:
        if item.path.relative_to(root).as_posix() in HEAVY:
            item.add_marker(pytest.mark.heavy)
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))


def pytest_collection_finish(session):
    """What collection imported (torch, this package, every test module) lives as long as the
    worker: out of the garbage collector's full collections, which would otherwise walk it
    again and again while the in-process tests allocate (about 5% of their time)."""
    gc.freeze()


def pytest_unconfigure(config):
    gc.unfreeze()  # the interpreter's last clean-up frees them (frozen, triton's bindings report leaks)
