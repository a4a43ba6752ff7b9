"""`credit rollout` with `rollout.members`: a noise-injecting model's members in CF's
`realization` dimension, and skill.csv's CRPS, spread and spread-skill ratio equal to a
computation by hand from the forecast files."""

import math

import numpy as np
import pytest
import xarray as xr
from rollouthelpers import forecast_path
from tiny import tiny_data_overrides

from credit.config import compose_config
from credit.rollout import run_rollout
from credit.rollout.skill import read_skill_csv
from credit.train import run_training

MEMBERS = 3
INITS = ["2001-01-02T00", "2001-01-04T06"]
MODEL = ["model=crossformer-ensemble", "model.dim=[8,16,32,64]", "model.dim_head=4",
         "model.local_window_size=[2,2,2,1]", "model.global_window_size=[2,2,1,1]", "model.noise_latent_dim=8",
         "model.freeze=false"]


@pytest.fixture(scope="module")
def ensemble_rollout(tmp_path_factory, tiny_data):
    run = tmp_path_factory.mktemp("ensemble_rollout") / "run"

    def overrides(*extra):
        return tiny_data_overrides(tiny_data, *MODEL, f"run_dir={run}", "rollout.progress_bar=false", *extra)

    run_training(compose_config(overrides("trainer.max_steps=2", "trainer.valid_every_n_steps=0",
                                          "trainer.ensemble_size=2", "trainer.loss.function=kcrps")))
    result = run_rollout(compose_config(overrides(f"rollout.init_times=[{','.join(INITS)}]", "rollout.lead_steps=2",
                                                  f"rollout.members={MEMBERS}")))
    return result


def test_the_members_are_a_realization_dimension_and_differ(ensemble_rollout):
    with xr.open_dataset(forecast_path(ensemble_rollout.output_dir, INITS[0])) as ds:
        assert ds["T"].dims == ("realization", "lead_time", "level", "latitude", "longitude")
        assert ds["realization"].attrs["standard_name"] == "realization"
        assert list(ds["realization"].values) == list(range(MEMBERS))
        assert float(ds["t2m"].std("realization").min()) > 0  # noise at every grid point
    assert (ensemble_rollout.output_dir / "spread_skill_vs_lead.png").stat().st_size > 0


def test_spread_and_its_ratio_are_the_files(ensemble_rollout):
    rows = {(r["lead_step"], r["channel"]): r for r in read_skill_csv(ensemble_rollout.output_dir / "skill.csv")}
    variances = []
    for init in INITS:
        with xr.open_dataset(forecast_path(ensemble_rollout.output_dir, init)) as ds:
            w = np.clip(np.cos(np.deg2rad(ds["latitude"].values)), 0, None)
            w = (w / w.mean())[:, None]
            t2m = ds["t2m"].values.astype(np.float64)  # (member, lead, lat, lon)
            variances.append([(w * t2m[:, lead].var(axis=0, ddof=1)).mean() for lead in range(2)])
    for lead in range(2):
        row = rows[(str(lead + 1), "t2m")]
        spread = math.sqrt(np.mean([v[lead] for v in variances]))
        assert float(row["spread"]) == pytest.approx(spread, rel=1e-5)  # the files hold float32
        ratio = math.sqrt((MEMBERS + 1) / MEMBERS) * float(row["spread"]) / float(row["rmse_model"])
        assert float(row["spread_skill"]) == pytest.approx(ratio, rel=1e-12)
        # the fair CRPS is at most the members' mean absolute error, at least 0 where they agree
        assert 0 < float(row["crps"]) < float(row["rmse_model"]) * 2
