"""skill.csv: the trained tiny model beats persistence at lead 1, and the scores equal a
computation by hand from the forecast files and the raw input files."""

import numpy as np
import pytest
import xarray as xr
from rollouthelpers import INITS, LEAD_STEPS, forecast_path

from credit.rollout.skill import COLUMNS, read_skill_csv

CHANNELS = ["U_500", "U_850", "V_500", "V_850", "T_500", "T_850", "Q_500", "Q_850", "SP", "t2m"]


def test_skill_table_layout(rollout):
    result, _ = rollout
    rows = read_skill_csv(result.output_dir / "skill.csv")
    assert list(rows[0]) == COLUMNS
    assert [(int(r["lead_step"]), r["channel"]) for r in rows] == [
        (lead, c) for lead in range(1, LEAD_STEPS + 1) for c in CHANNELS]
    assert {int(r["n_init"]) for r in rows} == {len(INITS)}
    assert {r["acc_climatology"] for r in rows} == {""}  # undefined: its anomaly is zero
    first = rows[0]
    assert (first["variable"], float(first["level"]), first["units"], float(first["lead_hours"])) == \
        ("U", 500.0, "m s-1", 6.0)


def test_trained_model_beats_persistence_at_lead_1(rollout):
    result, _ = rollout
    lead1 = [r for r in read_skill_csv(result.output_dir / "skill.csv") if r["lead_step"] == "1"]
    for row in lead1:
        model, persistence = float(row["rmse_model"]), float(row["rmse_persistence"])
        assert model < persistence, (row["channel"], model, persistence)
        assert float(row["rmse_climatology"]) > model, row["channel"]
        assert -1 <= float(row["acc_persistence"]) <= float(row["acc_model"]) <= 1, row["channel"]


def _weights(latitude):
    w = np.clip(np.cos(np.deg2rad(latitude)), 0, None)
    return (w / w.mean())[:, None]


@pytest.mark.parametrize("variable, level, lead", [("T", 850, 2), ("SP", None, 3)])
def test_scores_equal_a_hand_computation(rollout, tiny_data, variable, level, lead):
    result, _ = rollout
    raw = xr.open_dataset(tiny_data / "era5_2001.nc")
    train = xr.open_dataset(tiny_data / "era5_2000.nc")[variable]
    if level is not None:
        raw, train = raw.sel(level=level), train.sel(level=level)
    # climatology: mean of every training target time (all but the first time of the period)
    climatology = train.isel(time=slice(1, None)).mean("time").values.astype(np.float64)
    w = _weights(raw["latitude"].values)
    mse, acc, persistence_mse = [], [], []
    for init in INITS:
        ds = xr.open_dataset(forecast_path(result.output_dir, init))
        forecast = ds[variable].isel(lead_time=lead - 1)
        if level is not None:
            forecast = forecast.sel(level=level)
        forecast = forecast.values.astype(np.float64)
        truth = raw[variable].sel(time=ds["valid_time"].values[lead - 1]).values.astype(np.float64)
        start = raw[variable].sel(time=np.datetime64(init)).values.astype(np.float64)
        mse.append(np.mean(w * (forecast - truth) ** 2))
        persistence_mse.append(np.mean(w * (start - truth) ** 2))
        fa, oa = forecast - climatology, truth - climatology
        acc.append(np.sum(w * fa * oa) / np.sqrt(np.sum(w * fa**2) * np.sum(w * oa**2)))
    channel = variable if level is None else f"{variable}_{level}"
    row = next(r for r in read_skill_csv(result.output_dir / "skill.csv")
               if r["channel"] == channel and int(r["lead_step"]) == lead)
    assert float(row["rmse_model"]) == pytest.approx(np.sqrt(np.mean(mse)), rel=1e-5)
    assert float(row["rmse_persistence"]) == pytest.approx(np.sqrt(np.mean(persistence_mse)), rel=1e-5)
    assert float(row["acc_model"]) == pytest.approx(np.mean(acc), rel=1e-5)
