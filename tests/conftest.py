"""Shared fixtures: a tiny real dataset in ERA5 layout, and config overrides sized for it."""

from pathlib import Path

import pytest

from credit.data import generate_dataset

TINY_LEVELS = [500, 850]
TINY_MODEL = [
    "model.dim=[16,32]",
    "model.depth=[1,1]",
    "model.dim_head=8",
    "model.local_window_size=[2,2]",
    "model.global_window_size=[2,2]",
    "model.cross_embed_kernel_sizes=[[2,4],[2,4]]",
    "model.cross_embed_strides=[2,2]",
]


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
def tiny_overrides(tiny_data):
    """Overrides for a seconds-long training run on `tiny_data` writing to `run_dir`."""

    def make(run_dir: Path, *extra: str) -> list[str]:
        return [
            *TINY_MODEL,
            f"run_dir={run_dir}",
            f"data.root={tiny_data}",
            "data.generate_if_missing=false",
            f"data.levels=[{','.join(str(v) for v in TINY_LEVELS)}]",
            "data.train_period=[2000-01-01,2000-01-12]",
            "data.valid_period=[2001-01-01,2001-01-12]",
            "data.valid_samples=8",
            "trainer.batch_size=4",
            "trainer.progress_bar=false",
            "trainer.scheduler.warmup_steps=2",
            "trainer.optimizer.lr=2e-3",
            *extra,
        ]

    return make
