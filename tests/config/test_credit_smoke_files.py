"""CREDIT's smoke configs (`config/gen_2/smoke/`), their whole text as CREDIT's repository holds
it (tests/fixtures/credit_configs/whole_files.json), each run as a CREDIT user runs it here:
`credit data generate --like FILE`, then `credit train --credit-config` on the copy and
`credit rollout --credit-config` from what it saved. CREDIT's gen2 examples train in
tests/config/test_credit_like.py."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml
from launches import credit_command

from credit.interop.generate_like import generate_like

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
WHOLE_FILES = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "credit_configs"
                          / "whole_files.json").read_text())["files"]
# (file, --grid): the smallest grids whose boundary padding tiles each model's windows
SMOKE_FILES = [("config/gen_2/smoke/smoke_gen2_casper.yml", (64, 128)),
               ("config/gen_2/smoke/smoke_gen2_multistep_casper.yml", (32, 64)),
               ("config/gen_2/smoke/smoke_ensemble_gen2_casper.yml", (64, 128)),
               ("config/gen_2/smoke/smoke_v2branch_casper.yml", (64, 128))]


@pytest.mark.parametrize("name, grid", SMOKE_FILES, ids=[Path(n).stem for n, _ in SMOKE_FILES])
def test_the_smoke_config_trains_and_rolls_out_on_data_like_its_own(year_free_tmp_path, name, grid):
    tmp_path = year_free_tmp_path
    source = tmp_path / Path(name).name
    source.write_text(yaml.safe_dump(WHOLE_FILES[name], sort_keys=False))
    copy = generate_like(source, tmp_path / "data", grid=grid, days=1)
    common = ["--credit-config", str(copy)]
    trained = credit_command("train", *common, "trainer.max_steps=1", "trainer.valid_every_n_steps=0",
                             "trainer.progress_bar=false", env=ENV)
    assert trained.returncode == 0, trained.stderr[-3000:]
    with open(tmp_path / "data" / "run" / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row["split"] == "train"]
    assert len(rows) == 1 and np.isfinite(float(rows[0]["loss"])), rows
    forecast = credit_command("rollout", *common, "rollout.lead_steps=1", env=ENV)
    assert forecast.returncode == 0, forecast.stderr[-3000:]
    files = sorted(tmp_path.glob("data/**/forecast_*.nc"))
    assert files, forecast.stdout[-2000:]
    with xr.open_dataset(files[0]) as ds:
        names = [v for v in ds.data_vars if ds[v].ndim >= 3]
        assert names and all(bool(np.isfinite(ds[v].values).all()) for v in names), names
