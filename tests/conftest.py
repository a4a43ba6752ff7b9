"""Shared fixtures: a tiny real dataset in ERA5 layout, and config overrides sized for it."""

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
def tiny_overrides(tiny_data):
    """Overrides for a seconds-long training run on `tiny_data` writing to `run_dir`."""

    def make(run_dir: Path, *extra: str) -> list[str]:
        return _tiny_overrides(tiny_data, f"run_dir={run_dir}", *extra)

    return make
