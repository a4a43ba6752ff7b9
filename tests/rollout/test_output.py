"""The forecast files: CF netCDF that xarray opens without warnings, physical values equal to
a forward pass done by hand with the checkpoint's EMA weights and the dataset's normalisation."""

import warnings

import numpy as np
import pytest
import torch
import xarray as xr
from rollouthelpers import INITS, LEAD_STEPS, forecast_path

from credit.checkpoint.manager import load_checkpoint
from credit.config import compose_config
from credit.models import build_model
from credit.rollout import run_rollout
from credit.data import build_dataset
from credit.models import model_input

UPPER, SURFACE, LEVELS = ["U", "V", "T", "Q"], ["SP", "t2m"], [500.0, 850.0]


def open_strict(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return xr.open_dataset(path).load()


def test_files_are_cf_netcdf_with_the_right_shapes_and_coordinates(rollout, tiny_data):
    result, cfg = rollout
    assert [p.name for p in result.forecasts] == [f"forecast_{t}.nc" for t in INITS]
    assert result.weights == "ema"
    source = xr.open_dataset(tiny_data / "era5_2001.nc")
    for init, path in zip(INITS, result.forecasts):
        ds = open_strict(path)
        assert ds.attrs["Conventions"] == "CF-1.8"
        assert "credit rollout" in ds.attrs["history"] and "checkpoint" in ds.attrs["source"]
        assert set(ds.data_vars) == set(UPPER + SURFACE)
        for name in UPPER:
            assert ds[name].dims == ("lead_time", "level", "latitude", "longitude")
            assert ds[name].shape == (LEAD_STEPS, 2, 16, 32)
        for name in SURFACE:
            assert ds[name].dims == ("lead_time", "latitude", "longitude")
        for name in UPPER + SURFACE:
            assert ds[name].dtype == np.float32
            assert ds[name].encoding["zlib"] and ds[name].encoding["complevel"] == 4
            for key in ("units", "long_name", "standard_name"):
                assert ds[name].attrs[key] == source[name].attrs[key], (name, key)
            assert np.isfinite(ds[name].values).all()
        start = np.datetime64(init, "ns")
        leads = np.arange(1, LEAD_STEPS + 1) * np.timedelta64(6, "h")
        assert ds["init_time"].dims == () and ds["init_time"].values == start
        assert ds["init_time"].attrs["standard_name"] == "forecast_reference_time"
        np.testing.assert_array_equal(ds["lead_time"].values, leads.astype("timedelta64[ns]"))
        assert ds["valid_time"].dims == ("lead_time",)
        np.testing.assert_array_equal(ds["valid_time"].values, start + leads)
        np.testing.assert_array_equal(ds["level"].values, LEVELS)
        assert ds["level"].attrs["units"] == "hPa"
        np.testing.assert_array_equal(ds["latitude"].values, source["latitude"].values)
        assert ds["latitude"].attrs["units"] == "degrees_north"
        np.testing.assert_array_equal(ds["longitude"].values, source["longitude"].values)


def _hand_forecast(cfg, checkpoint, init, leads, weights):
    """`leads` steps by hand: plain model, DCP weights, dataset inputs, then denormalised."""
    dataset = build_dataset(cfg.data, "valid_period")
    index = int(np.flatnonzero(dataset.times == np.datetime64(init, "ns"))[0])
    sample = dataset[index]
    model = build_model(cfg.model, in_channels=sample["state"].shape[1] + sample["forcing"].shape[1]
                        + sample["static"].shape[0], out_channels=sample["target"].shape[1],
                        state_channels=sample["state"].shape[1], history_len=1, grid=(16, 32))
    state = {"model": model.state_dict()}
    if weights == "ema":
        state["ema"] = {k: torch.empty_like(v) for k, v in model.named_parameters()}
    load_checkpoint(checkpoint, state)
    model.load_state_dict(state["model"])
    with torch.no_grad():
        if weights == "ema":
            for name, param in model.named_parameters():
                param.copy_(state["ema"][name])
        x, out = sample["state"][None], []
        for k in range(leads):
            forcing = dataset[index + k]["forcing"][1][None]
            prediction = model(model_input(x, forcing, sample["static"][None]))
            x = prediction[:, None, : x.shape[2]]
            out.append(prediction[0].double().numpy() * dataset.target_std[:, None, None]
                       + dataset.target_mean[:, None, None])
    return np.stack(out)


def _file_channels(ds):
    """(lead, channel, lat, lon) in the dataset's channel order."""
    return np.concatenate([ds[v].values for v in UPPER] + [ds[v].values[:, None] for v in SURFACE], axis=1)


def test_values_are_the_denormalised_ema_forecast(rollout, tiny_data):
    result, cfg = rollout
    init = INITS[1]
    ds = open_strict(forecast_path(result.output_dir, init))
    written = _file_channels(ds)
    by_hand = _hand_forecast(cfg, result.checkpoint, init, 2, "ema")
    scale = build_dataset(cfg.data, "valid_period").target_std[None, :, None, None]
    np.testing.assert_allclose(written[:2] / scale, by_hand / scale, rtol=1e-5, atol=1e-5)
    live = _hand_forecast(cfg, result.checkpoint, init, 1, "model")
    assert np.abs(written[:1] - live).max() > 1e-3  # the EMA weights, not the live ones, were used
    # Physical units: close to the raw truth in the input file at the valid time.
    truth = xr.open_dataset(tiny_data / "era5_2001.nc").sel(time=ds["valid_time"].values[0])
    for name in ("T", "SP"):
        error = np.sqrt(np.mean((ds[name].values[0] - truth[name].values) ** 2))
        assert error < 0.2 * float(truth[name].std()), name


def test_an_init_range_and_model_weights(trained_run, tmp_path):
    _, overrides = trained_run
    cfg = compose_config(overrides(
        "rollout.init_range.start=2001-01-02T00", "rollout.init_range.end=2001-01-03T12",
        "rollout.init_range.every_hours=12", "rollout.lead_steps=1", "rollout.weights=model",
        "rollout.skill=false", f"rollout.output_dir={tmp_path}", "rollout.complevel=0"))
    result = run_rollout(cfg)
    names = ["2001-01-02T00", "2001-01-02T12", "2001-01-03T00", "2001-01-03T12"]
    assert [p.name for p in result.forecasts] == [f"forecast_{n}.nc" for n in names]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"forecast_{n}.nc" for n in names]
    ds = open_strict(tmp_path / "forecast_2001-01-03T12.nc")
    assert not ds["T"].encoding["zlib"]
    by_hand = _hand_forecast(cfg, result.checkpoint, "2001-01-03T12", 1, "model")
    scale = build_dataset(cfg.data, "valid_period").target_std[None, :, None, None]
    np.testing.assert_allclose(_file_channels(ds) / scale, by_hand / scale, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["skill.csv", "rmse_vs_lead.png", f"map_U_500_{INITS[0]}_lead{LEAD_STEPS}.png"])
def test_skill_files_exist(rollout, name):
    result, _ = rollout
    assert (result.output_dir / name).stat().st_size > 1000
