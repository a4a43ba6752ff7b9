"""A CREDIT config file's data, trainer and loss sections (credit/interop/config_file.py):
the loss it maps to equals CREDIT's own on the same tensors (tests/fixtures/credit_gen1_data,
made with CREDIT's code), `credit check` reports every key, `credit train` trains from a
config `credit data generate --layout credit-gen1` wrote, and what is not honoured is one line."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from launches import credit_command
import torch
import xarray as xr
import yaml
from credit_fixtures import FP32_UNIT_ROUNDOFF, sum_rounding_bound

from credit.config import compose_config
from credit.interop.config_file import TABLE, map_credit_file
from credit.data.latitude import latitude_weights
from credit.train.losses import WeightedLoss, channel_weights
from credit.train.schedule import schedule_function
from credit.train.validation import output_channel_variables

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "credit_gen1_data"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return credit_command(*args, env=ENV, timeout=timeout)


@pytest.mark.parametrize("case", ["mse_train", "huber_train"])
def test_the_mapped_loss_equals_credits_with_latitude_and_variable_weights(case):
    fixture = torch.load(FIXTURE / "loss.pt")
    section = dict(fixture["cases"][case]["loss_section"])
    mapping = map_credit_file({"loss": section})
    assert mapping.refused == []
    cfg = compose_config([*mapping.overrides, "data.variables.diagnostic=[tp]"]).trainer.loss
    data = fixture["data"]
    channels = output_channel_variables(data["variables"], [500, 700, 850], data["surface_variables"],
                                        data["diagnostic_variables"])
    with xr.open_dataset(FIXTURE / "data" / "latw.nc") as latw:
        lat = np.asarray(latw["latitude"].values)
    lat_w = latitude_weights(lat) if cfg.latitude_weighting else torch.ones(len(lat))
    loss = WeightedLoss(lat_w, channel_weights(channels, cfg.variable_weights, cfg.normalize_variable_weights),
                        cfg.function, cfg.huber_delta)
    ours = loss(fixture["y_pred"][:, :, 0], fixture["y"][:, :, 0])
    # an error bound, not a measured spread: each run's terms (all >= 0) are within 8 roundings
    # of exact plus those of the latitude weights' mean, then summed; twice that between runs
    terms = fixture["y_pred"][:, :, 0].numel()
    rtol = 2 * (8 * FP32_UNIT_ROUNDOFF + sum_rounding_bound(len(lat)) + sum_rounding_bound(terms))
    torch.testing.assert_close(ours, fixture["cases"][case]["value"].to(ours.dtype), rtol=rtol, atol=0)


def test_every_table_row_names_a_credit_key_once_per_schema():
    rows = [(rule.schema, rule.key) for rule in TABLE]
    assert len(rows) == len(set(rows))
    shared = {key for schema, key in rows if schema == ""}
    assert not shared & {key for schema, key in rows if schema}, "a schema's row would shadow a shared one"
    assert all(rule.schema in ("", "gen1", "gen2") for rule in TABLE)
    assert all(rule.convert is not None or rule.note for rule in TABLE)


@pytest.fixture(scope="module")
def credit_dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("credit_gen1") / "data"
    result = _cli("data", "generate", "--layout", "credit-gen1", "--out", str(out), "--grid", "8x16",
                  "--years", "2000", "2001", "--levels", "500", "850", "--days-per-year", "4", "--no-progress")
    assert result.returncode == 0, result.stderr
    return out


def test_check_reports_every_key_and_runs_nothing(credit_dataset):
    config = credit_dataset / "credit.yml"
    result = _cli("check", "--credit-config", str(config), "trainer.max_steps=3")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    conf = yaml.safe_load(config.read_text())
    for section in ("data", "trainer", "loss"):
        for key in conf[section]:
            assert f"\n{section}.{key}" in out, key  # mapped, ignored or read with another key
    assert "data.train_years -> data.train_period=[2000-01-01,2000-12-31]" in out  # end year exclusive
    assert "data.forecast_len -> data.forecast_len=1" in out
    assert "data.levels -> data.levels=[500.0,850.0]" in out
    assert "max_steps: 3" in out  # the user's overrides win
    assert not (conf["save_loc"] and Path(conf["save_loc"]).exists())


def test_train_from_the_generated_credit_config(credit_dataset, tmp_path):
    run = tmp_path / "run"
    result = _cli("train", "--credit-config", str(credit_dataset / "credit.yml"), f"run_dir={run}",
                  "trainer.max_steps=3", "trainer.steps_per_job=0", "trainer.progress_bar=false")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning: " in result.stderr and "CREDIT keys ignored here: " in result.stderr
    with open(run / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["split"] == "train"]
    assert rows and np.isfinite(float(rows[-1]["loss"]))
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    conf = yaml.safe_load((credit_dataset / "credit.yml").read_text())
    assert cfg["model"]["name"] == "crossformer" and cfg["data"]["layout"] == "credit-gen1"
    assert cfg["trainer"]["batch_size"] == conf["trainer"]["train_batch_size"]
    assert cfg["trainer"]["optimizer"]["lr"] == conf["trainer"]["learning_rate"]
    assert cfg["trainer"]["seed"] == conf["seed"]

    # CREDIT's predict: section: init times, forecast length and output folder
    out = tmp_path / "forecasts"
    forecast = _cli("rollout", "--credit-config", str(credit_dataset / "credit.yml"), f"run_dir={run}",
                    f"rollout.output_dir={out}", "rollout.progress_bar=false")
    assert forecast.returncode == 0, forecast.stderr[-3000:]
    start = conf["predict"]["forecasts"]
    init = f"{start['start_year']}-{start['start_month']:02d}-{start['start_day']:02d}T00"
    with xr.open_dataset(out / f"forecast_{init}.nc") as ds:
        assert ds.sizes["lead_time"] == start["days"] * 24 // conf["data"]["lead_time_periods"]
        assert {"U", "V", "T", "Q", "SP", "t2m"} <= set(ds.data_vars)
        assert np.isfinite(ds["T"].values).all()


def test_full_pass_epochs_dynamic_clipping_and_restarts(credit_dataset, tmp_path):
    """batches_per_epoch: 0 (a full pass), grad_max_norm: dynamic and CREDIT's restarts
    schedule, as CREDIT's example config sets them; and valid_forecast_len: 1, CREDIT's
    validation of the second of two autoregressive steps."""
    conf = yaml.safe_load((credit_dataset / "credit.yml").read_text())
    conf["save_loc"] = str(tmp_path / "run")
    conf["data"]["valid_forecast_len"] = 1
    conf["trainer"].update(batches_per_epoch=0, epochs=1, num_epoch=1, grad_max_norm="dynamic", use_scheduler=True,
                           scheduler={"scheduler_type": "cosine-annealing-restarts", "first_cycle_steps": 4,
                                      "cycle_mult": 1.0, "max_lr": 1e-3, "min_lr": 1e-5, "warmup_steps": 1})
    config = tmp_path / "credit.yml"
    config.write_text(yaml.safe_dump(conf))
    result = _cli("train", "--credit-config", str(config), "trainer.progress_bar=false", "trainer.log_every_n_steps=1")
    assert result.returncode == 0, result.stderr[-3000:]
    resolved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    cfg = resolved["trainer"]
    assert resolved["data"]["valid_forecast_len"] == 2 and resolved["data"]["forecast_len"] == 1
    samples = 4 * 4 - 1  # four days of 6-hourly times, one step of history
    assert cfg["max_steps"] == samples // conf["trainer"]["train_batch_size"] and cfg["grad_clip_dynamic"]
    with open(tmp_path / "run" / "metrics.csv") as f:
        everything = list(csv.DictReader(f))
    rows = [r for r in everything if r["split"] == "train"]
    valid = [r for r in everything if r["split"] == "valid"]
    assert len(rows) == cfg["max_steps"]
    assert valid and all(np.isfinite(float(r["loss"])) for r in valid)
    assert float(rows[0]["lr"]) == pytest.approx(1e-5) and float(rows[1]["lr"]) == pytest.approx(1e-3)


@pytest.mark.parametrize("change, refusal", [
    ({"trainer": {"amp": True}}, "trainer.amp: true"),
    ({"loss": {"training_loss": "almost-fair-crps"}}, "loss.training_loss: 'almost-fair-crps' with trainer.ensemble_size 1"),
    ({"trainer": {"ensemble_size": 4}}, "trainer.ensemble_size: 4 with loss.training_loss"),
    ({"trainer": {"compile": True}}, "trainer.compile: true"),
    ({"trainer": {"mode": "domain_parallel", "domain_parallel_size": 2}},
     "trainer.mode: 'domain_parallel'; CREDIT's domain parallelism computes long-distance attention within"),
    ({"data": {"source": {"ERA5": {"dataset_type": "arco_era5"}}}}, "data.source.ERA5.dataset_type: 'arco_era5'"),
])
def test_what_is_not_honoured_is_one_line_before_any_work(credit_dataset, tmp_path, change, refusal):
    conf = yaml.safe_load((credit_dataset / "credit.yml").read_text())
    for section, values in change.items():
        conf[section] = values if "source" in values else {**conf.get(section, {}), **values}
    conf["save_loc"] = str(tmp_path / "run")
    config = tmp_path / "credit.yml"
    config.write_text(yaml.safe_dump(conf))
    result = _cli("train", "--credit-config", str(config))
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and refusal in errors[0], result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("trainer_type", ["era5-gen1", "era5", "standard", "universal", "multi-step", "cam"])
def test_credits_era5_trainer_types_map_and_others_are_refused(trainer_type):
    """'standard', 'universal' and 'multi-step' are earlier names of CREDIT's ERA5 trainers (its
    arXiv 2024 and older gen1 configs; CREDIT's `credit convert` maps the first two to the ERA5
    trainer): accepted as era5 is."""
    assert map_credit_file({"trainer": {"type": trainer_type}}).refused == []
    refused = map_credit_file({"trainer": {"type": "ic-opt"}}).refused
    assert len(refused) == 1 and "trainer.type: 'ic-opt'" in refused[0] and "standard" in refused[0]
    # an ocean model's file: its trainer is named first, then its dates where years go
    refused = map_credit_file({"data": {"train_years": ["1975-01-03T00:00:00", "2014-09-20T00:00:00"]},
                               "trainer": {"type": "samudra"}}).refused
    assert refused[0].startswith("trainer.type: 'samudra'") and "data.train_years" in refused[1], refused


def test_a_scaler_credit_refuses_too_says_so():
    old = map_credit_file({"data": {"scaler_type": "std"}}).refused
    assert len(old) == 1 and "'std'" in old[0] and "CREDIT's own trainer refuses it too" in old[0]
    cached = map_credit_file({"data": {"scaler_type": "std_cached"}}).refused
    assert len(cached) == 1 and "only 'std_new'" in cached[0]
    assert map_credit_file({"data": {"scaler_type": "std_new"}}).refused == []


def test_the_docs_table_names_every_row():
    page = (Path(__file__).resolve().parents[2] / "docs" / "credit_config.md").read_text()
    for rule in TABLE:
        assert f"| `{rule.key}` |" in page, rule.key


SCHEDULERS = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "credit_schedulers"
                         / "lr_sequences.json").read_text())["cases"]


@pytest.mark.parametrize("case", sorted(SCHEDULERS))
def test_the_mapped_schedule_gives_credits_learning_rates(case):
    """CREDIT's scheduler objects, stepped as its gen1 trainer steps them (fixture), against
    the schedule a CREDIT trainer section maps to, at every optimizer step."""
    entry = SCHEDULERS[case]
    mapping = map_credit_file(entry["conf"])
    assert mapping.refused == []
    cfg = compose_config([*mapping.overrides, "trainer.max_steps=1000"]).trainer
    multiplier = schedule_function(cfg.scheduler, cfg.max_steps, entry["batches_per_epoch"] or 1)
    ours = [cfg.optimizer.lr * multiplier(step) for step in range(entry["n_steps"])]
    np.testing.assert_allclose(ours, entry["lrs"], rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("forecasts, inits, leads", [
    ({"type": "custom", "start_year": 2018, "start_month": 6, "start_day": 1, "start_hours": [0, 12],
      "duration": 2, "days": 3}, ["2018-06-01T00:00", "2018-06-01T12:00", "2018-06-02T00:00", "2018-06-02T12:00"], 12),
    ({"type": "custom", "start_year": 2020, "start_month": 2, "start_day": 28, "duration": 4, "ic_interval_days": 2,
      "days": 1}, ["2020-02-28T00:00", "2020-03-01T00:00"], 4),
    ([["2019-01-01 00:00:00", "2019-01-02 18:00:00"], ["2019-03-01 06:00:00", "2019-03-03 00:00:00"]],
     ["2019-01-01T00:00", "2019-03-01T06:00"], 8),
])
def test_predict_forecasts_become_rollout_init_times_and_leads(forecasts, inits, leads):
    mapping = map_credit_file({"data": {"lead_time_periods": 6}, "predict": {"forecasts": forecasts}})
    rollout = dict(pair.split("=", 1) for pair in mapping.overrides if pair.startswith("rollout."))
    assert rollout["rollout.init_times"] == "[" + ",".join(f"'{t}'" for t in inits) + "]"
    assert int(rollout["rollout.lead_steps"]) == leads


def test_credits_ring_crps_is_the_fair_crps_with_one_member_a_rank():
    """CREDIT's `ring-crps` puts one member on each data-parallel rank (its trainer refuses an
    ensemble_size other than their number): here the fair CRPS over an ensemble axis of that
    many ranks, one member each (its gradients: tests/parallel/test_ensemble_gather.py)."""
    mapped = map_credit_file({"loss": {"training_loss": "ring-crps"}, "trainer": {"ensemble_size": 4, "mode": "ddp"}})
    assert mapped.refused == [] and {"trainer.loss.function=almost_fair_crps", "trainer.parallelism.ensemble=4",
                                      "trainer.ensemble_size=4"} <= set(mapped.overrides), mapped.overrides
    refused = map_credit_file({"loss": {"training_loss": "ring-crps"}}).refused
    assert len(refused) == 1 and "ring-crps" in refused[0] and "trainer.ensemble_size 1" in refused[0]


def test_kcrps_over_one_member_trains_its_absolute_error_with_one_warning(credit_dataset, tmp_path, capsys):
    """CREDIT's KCRPS over one member divides 0 by m (m - 1) = 0 and is NaN (fixture
    crps_meta.json), its archive v1 wxformer files ask for it: here the CRPS of one member, the
    absolute error, with one warning that says how the file is read otherwise than CREDIT runs it."""
    from credit.interop.command_line import credit_file_overrides

    meta = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "credit_losses" / "crps_meta.json").read_text())
    assert meta["one_member_kcrps_is_nan"] is True
    conf = yaml.safe_load((credit_dataset / "credit.yml").read_text())
    conf["loss"]["training_loss"] = "KCRPS"
    config = tmp_path / "credit.yml"
    config.write_text(yaml.safe_dump(conf))
    overrides, _ = credit_file_overrides(["--credit-config", str(config)])
    assert "trainer.loss.function=mae" in overrides
    warnings = [line for line in capsys.readouterr().err.splitlines() if "KCRPS" in line]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {config}: loss.training_loss: 'KCRPS' with "
                                                         "trainer.ensemble_size 1 trains the CRPS of one member")
    conf["trainer"]["ensemble_size"] = 2  # two members: CREDIT's KCRPS itself, no warning
    assert "trainer.loss.function=kcrps" in map_credit_file(conf).overrides and not map_credit_file(conf).read_otherwise
