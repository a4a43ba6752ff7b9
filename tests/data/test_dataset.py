"""ERA5Dataset against values read directly with xarray from generated files."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import xarray as xr
from datahelpers import ANY_FILES, FILES, SPEC, files_for

from credit.data import DataError, ERA5Dataset, VariableSpec

LEVELS_REQ = (850, 500)  # deliberately not the file order


def _make(root, **kw):
    args = dict(files=files_for(root), variables=SPEC, levels=LEVELS_REQ, period=("2000-01-01", "2000-01-02"),
                history_len=2, forecast_len=1)
    args.update(kw)
    return ERA5Dataset(root, **args)


def _manual(root, times, var, levels=None):
    """Values read straight from the yearly files, in time order."""
    ext = ".zarr" if (root / "static.zarr").exists() else ".nc"
    year_files = sorted(root.glob(f"era5_*{ext}" if var != "tsi" else f"forcing_*{ext}"))
    parts = []
    for path in year_files:
        with xr.open_dataset(path) as ds:
            parts.append(ds[var].load())
    da = xr.concat(parts, "time").sel(time=times)
    if levels is not None:
        da = da.sel(level=list(levels))
    return da.values.astype(np.float64)


def _stats(root, var, levels=None):
    with xr.open_dataset(root / "mean.nc") as m, xr.open_dataset(root / "std.nc") as s:
        if levels is None:
            return float(m[var]), float(s[var])
        return (m[var].sel(level=list(levels)).values.astype(np.float64)[:, None, None],
                s[var].sel(level=list(levels)).values.astype(np.float64)[:, None, None])


def test_shapes_channel_order_and_normalisation(small_any_root):
    small_root = small_any_root
    ds = _make(small_root)
    assert len(ds) == 6  # 8 six-hourly times, 3 per sample
    assert ds.state_channel_names == ["U_850", "U_500", "V_850", "V_500", "T_850", "T_500", "Q_850", "Q_500", "SP"]
    assert ds.target_channel_names == ds.state_channel_names + ["t2m"]
    assert ds.forcing_channel_names == ["tsi"] and ds.static_channel_names == ["Z_GDS4_SFC", "LSM"]
    assert ds.grid_shape == (8, 16) and ds.latitude[0] == 90.0 and ds.longitude.shape == (16,)
    assert ds.target_channel_groups["T"] == [4, 5] and ds.target_channel_groups["t2m"] == [9]
    assert ds.variable_of_channel["Q_500"] == "Q"
    sample = ds[1]
    assert sample["state"].shape == (2, 9, 8, 16) and sample["state"].dtype == torch.float32
    assert sample["forcing"].shape == (3, 1, 8, 16)
    assert sample["static"].shape == (2, 8, 16)
    assert sample["target"].shape == (1, 10, 8, 16)
    assert sample["time"].dtype == torch.int64 and sample["index"].item() == 1
    times = np.datetime64("2000-01-01T06:00", "ns") + np.arange(3) * np.timedelta64(6, "h")
    assert np.array_equal(sample["time"].numpy(), times.astype(np.int64))
    assert ds.times[1] == times[0]

    t_mean, t_std = _stats(small_root, "T", LEVELS_REQ)
    t_raw = _manual(small_root, times, "T", LEVELS_REQ)
    np.testing.assert_allclose(sample["state"][:, 4:6].numpy(), (t_raw[:2] - t_mean) / t_std, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sample["target"][0, 4:6].numpy(), (t_raw[2] - t_mean) / t_std, rtol=1e-5, atol=1e-5)
    sp_mean, sp_std = _stats(small_root, "SP")
    sp_raw = _manual(small_root, times, "SP")
    np.testing.assert_allclose(sample["state"][:, 8].numpy(), (sp_raw[:2] - sp_mean) / sp_std, atol=1e-5)
    t2m_mean, t2m_std = _stats(small_root, "t2m")
    np.testing.assert_allclose(sample["target"][0, 9].numpy(), (_manual(small_root, times, "t2m")[2] - t2m_mean)
                               / t2m_std, atol=1e-5)
    tsi_mean, tsi_std = _stats(small_root, "tsi")
    np.testing.assert_allclose(sample["forcing"][:, 0].numpy(), (_manual(small_root, times, "tsi") - tsi_mean)
                               / tsi_std, atol=1e-5)
    with xr.open_dataset(next(small_root.glob("static.*"))) as st:
        z_mean, z_std = _stats(small_root, "Z_GDS4_SFC")
        np.testing.assert_allclose(sample["static"][0].numpy(), (st["Z_GDS4_SFC"].values - z_mean) / z_std, atol=1e-5)
    assert ds.target_mean.shape == (10,) and ds.target_std.shape == (10,)
    np.testing.assert_allclose(ds.target_mean[4:6], t_mean.ravel(), rtol=1e-6)
    # Denormalising the target recovers physical units.
    physical = sample["target"][0].numpy() * ds.target_std[:, None, None] + ds.target_mean[:, None, None]
    np.testing.assert_allclose(physical[4:6], t_raw[2], rtol=1e-5)

    raw = _make(small_root, normalize=False)[1]
    np.testing.assert_allclose(raw["state"][:, 4:6].numpy(), t_raw[:2], rtol=1e-6)
    assert len(_make(small_root, stride=2)) == 3 and _make(small_root, stride=2)[1]["time"][0] == sample["time"][1]


def test_samples_cross_the_year_boundary(boundary_any_root):
    boundary_root = boundary_any_root
    ds = _make(boundary_root, period=("2000-12-31", "2001-01-01"), history_len=2, forecast_len=2, normalize=False)
    assert len(ds) == 5
    crossing = 0
    for i in range(len(ds)):
        s = ds[i]
        times = s["time"].numpy().astype("datetime64[ns]")
        assert np.all(np.diff(times) == np.timedelta64(6, "h"))
        crossing += times[0].astype("datetime64[Y]") != times[-1].astype("datetime64[Y]")
        u = _manual(boundary_root, times, "U", LEVELS_REQ)
        np.testing.assert_array_equal(s["state"][:, 0:2].numpy(), u[:2].astype(np.float32))
        np.testing.assert_array_equal(s["target"][:, 0:2].numpy(), u[2:].astype(np.float32))
    assert crossing == 3


def test_samples_never_span_a_gap_between_files(small_any_root):
    small_root = small_any_root
    ds = _make(small_root, period=("2000-01-01", "2001-01-02"))
    assert len(ds) == 12  # 6 per two-day file; none across the year-long gap
    for t in ds.times:
        assert t.astype("datetime64[Y]") in (np.datetime64("2000", "Y"), np.datetime64("2001", "Y"))


def test_each_file_opened_once_per_process(small_any_root):
    small_root = small_any_root
    ds = _make(small_root, period=("2000-01-01", "2001-01-02"))
    assert ds.open_count == 0  # construction only scans
    for _ in range(2):
        for i in range(len(ds)):
            ds[i]
    assert ds.open_count == 5  # era5 x2, forcing x2, static (era5 serves three roles, opened once)


def test_dataloader_workers_reopen_their_own_handles(small_any_root):
    ds = _make(small_any_root)
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2, multiprocessing_context="fork")
    batches = list(loader)
    assert ds.open_count == 0  # the parent never read
    direct = torch.stack([ds[i]["state"] for i in range(3)])
    assert torch.equal(batches[0]["state"], direct) and ds.open_count == 3


class _InWorker(torch.utils.data.Dataset):
    """Samples of `ds`, with whether each tensor was in shared memory when the worker made it."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, index):
        sample = self.ds[index]
        shared = [sample[key].is_shared() for key in ("state", "forcing", "static", "target")]
        return {**sample, "shared": torch.tensor(shared)}


def test_worker_samples_are_made_in_shared_memory(small_any_root):
    """A worker fills its sample in shared memory and sends a batch of one as a view of it:
    no copy into shared memory on the way to the main process; the values are the same."""
    from credit.data import collate_samples

    ds = _make(small_any_root)
    loader = torch.utils.data.DataLoader(_InWorker(ds), batch_size=1, num_workers=2, collate_fn=collate_samples,
                                         multiprocessing_context="fork")
    batches = list(loader)
    assert len(batches) == len(ds)
    for i, batch in enumerate(batches):
        assert batch["shared"].all(), i
        direct = ds[i]
        assert not direct["state"].is_shared()  # the loading process keeps private memory
        for key in ("state", "forcing", "static", "target", "time"):
            assert torch.equal(batch[key][0], direct[key]), (i, key)


def test_netcdf_and_zarr_mixed_in_one_dataset(small_root, small_zarr_root, tmp_path):
    """A glob may match .nc files and .zarr stores together: 2000 from netCDF, 2001 from zarr,
    the same samples as all-netCDF; files inside a store are never taken for data files."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("era5_2000.nc", "forcing_2000.nc", "static.nc", "mean.nc", "std.nc"):
        shutil.copy(small_root / name, mixed / name)
    for name in ("era5_2001.zarr", "forcing_2001.zarr"):
        shutil.copytree(small_zarr_root / name, mixed / name)
    period = ("2000-01-01", "2001-01-02")
    ds = _make(mixed, files=ANY_FILES, period=period)
    ref = _make(small_root, period=period)
    assert len(ds) == len(ref) == 12
    for i in (0, 6, 11):
        for key in ("state", "forcing", "static", "target", "time"):
            assert torch.equal(ds[i][key], ref[i][key])
    with pytest.raises(DataError, match="no file"):  # a glob reaching into a store finds nothing
        _make(mixed, files={**ANY_FILES, "forcing": "forcing_2001.zarr/tsi/*"}, period=period)


def _copy_with(src, dst, fn):
    """Copy a dataset directory, rewriting every netCDF file with ``fn(xr.Dataset)``."""
    dst.mkdir()
    for path in src.iterdir():
        with xr.open_dataset(path) as ds:
            fn(ds.load()).to_netcdf(dst / path.name)


def test_ascending_latitude_and_custom_level_name(small_root, tmp_path):
    def rewrite(d: xr.Dataset) -> xr.Dataset:
        if "latitude" in d.dims:
            d = d.isel(latitude=slice(None, None, -1))
        return d.rename({"level": "isobaricInhPa"}) if "level" in d.dims else d

    flipped = tmp_path / "flipped"
    _copy_with(small_root, flipped, rewrite)
    ds = _make(flipped, level_dim="isobaricInhPa", normalize=False)
    ref = _make(small_root, normalize=False)
    assert ds.latitude[0] == -90.0 and np.all(np.diff(ds.latitude) > 0)
    a, b = ds[2], ref[2]
    for key in ("state", "target", "forcing", "static"):
        assert torch.equal(a[key], b[key].flip(-2)), key
    with pytest.raises(DataError, match="'level'"):
        _make(flipped)


def test_errors_name_file_and_variable(small_root, tmp_path):
    with pytest.raises(DataError, match="unknown role.*'extra'"):
        _make(small_root, files={**FILES, "extra": "x.nc"})
    with pytest.raises(DataError, match="missing role.*'static'"):
        _make(small_root, files={k: v for k, v in FILES.items() if k != "static"})
    with pytest.raises(DataError, match=r"'nope_\*\.nc' matches no file under root .*small"):
        _make(small_root, files={**FILES, "forcing": "nope_*.nc"})
    with pytest.raises(DataError, match=r"variable 'RH' \(upper_air\) not found in files \['era5_2000.nc', "
                                        r"'era5_2001.nc'\]"):
        _make(small_root, variables=VariableSpec(upper_air=("U", "RH"), surface=("SP",)))
    with pytest.raises(DataError, match=r"level 925 of variable 'U' is not in .*era5_2000.nc.*available levels: "
                                        r"500, 850"):
        _make(small_root, levels=(850, 925))
    with pytest.raises(DataError, match=r"period \('2003-01-01', '2003-02-01'\) lies outside the data: files "
                                        r"\['era5_2000.nc', .*span 2000-01-01T00:00:00 to 2001-01-02T18:00:00"):
        _make(small_root, period=("2003-01-01", "2003-02-01"))
    with pytest.raises(DataError, match="history_len must be >= 1"):
        _make(small_root, history_len=0)
    with pytest.raises(DataError, match="forecast_len must be >= 1"):
        _make(small_root, forecast_len=0)
    with pytest.raises(DataError, match=r"yields no sample of 3 consecutive 6-hourly times"):
        _make(small_root, period=("2000-01-01T00:00", "2000-01-01T06:00"))
    with pytest.raises(DataError, match=r"variable 'U' not found in the mean files \['static.nc'\]"):
        _make(small_root, files={**FILES, "mean": "static.nc"})
    coarse = tmp_path / "coarse"
    shutil.copytree(small_root, coarse)
    with xr.open_dataset(small_root / "static.nc") as st:
        st.load().isel(latitude=slice(0, 4)).to_netcdf(coarse / "static.nc")
    with pytest.raises(DataError, match=r"inconsistent grids: .*static.nc has 4x16 points.*era5_2000.nc has 8x16"):
        _make(coarse)
    with pytest.raises(DataError, match=r"variable 'SP' in .*era5_2000.nc has dims \('time', 'latitude', "
                                        r"'longitude'\); the static role needs"):
        _make(small_root, files={**FILES, "static": "era5_2000.nc"},
              variables=VariableSpec(upper_air=("U",), static=("SP",)))
    assert issubclass(DataError, ValueError)
