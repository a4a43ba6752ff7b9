"""Small generated datasets shared by the data-layer tests (real netCDF files, session-scoped)."""

from __future__ import annotations

import pytest

from datahelpers import GRID, LEVELS

from credit.data import generate_dataset


def _small(tmp_path_factory, file_format):
    return generate_dataset(tmp_path_factory.mktemp(f"small_{file_format}"), grid=GRID, years=(2000, 2001),
                            levels=LEVELS, days_per_year=2, seed=3, progress=False, file_format=file_format)


def _boundary(tmp_path_factory, file_format):
    return generate_dataset(tmp_path_factory.mktemp(f"boundary_{file_format}"), grid=GRID, years=(2000, 2001),
                            levels=LEVELS, time_range=("2000-12-31", "2001-01-01"), train_years=(2000, 2001),
                            seed=3, progress=False, file_format=file_format)


@pytest.fixture(scope="session")
def small_root(tmp_path_factory):
    """Two years (2000 trains the stats), first 2 days of each: 8 six-hourly times per file."""
    return _small(tmp_path_factory, "netcdf")


@pytest.fixture(scope="session")
def small_zarr_root(tmp_path_factory):
    """`small_root` written as zarr stores (same seed: the same values)."""
    return _small(tmp_path_factory, "zarr")


@pytest.fixture(params=["netcdf", "zarr"])
def small_any_root(request, small_root, small_zarr_root):
    """`small_root` in each file format."""
    return small_root if request.param == "netcdf" else small_zarr_root


@pytest.fixture(scope="session")
def boundary_root(tmp_path_factory):
    """Contiguous times across the 2000/2001 year boundary, split into two yearly files."""
    return _boundary(tmp_path_factory, "netcdf")


@pytest.fixture(scope="session", params=["netcdf", "zarr"])
def boundary_any_root(request, tmp_path_factory):
    """`boundary_root` in each file format."""
    return _boundary(tmp_path_factory, request.param)
