"""Small generated datasets shared by the data-layer tests (real netCDF files, session-scoped)."""

from __future__ import annotations

import pytest

from datahelpers import GRID, LEVELS

from credit.data import generate_dataset


@pytest.fixture(scope="session")
def small_root(tmp_path_factory):
    """Two years (2000 trains the stats), first 2 days of each: 8 six-hourly times per file."""
    return generate_dataset(tmp_path_factory.mktemp("small"), grid=GRID, years=(2000, 2001), levels=LEVELS,
                            days_per_year=2, seed=3, progress=False)


@pytest.fixture(scope="session")
def boundary_root(tmp_path_factory):
    """Contiguous times across the 2000/2001 year boundary, split into two yearly files."""
    return generate_dataset(tmp_path_factory.mktemp("boundary"), grid=GRID, years=(2000, 2001), levels=LEVELS,
                            time_range=("2000-12-31", "2001-01-01"), train_years=(2000, 2001), seed=3,
                            progress=False)
