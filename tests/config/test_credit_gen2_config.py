"""CREDIT's gen2 schema end to end: `credit data generate --layout credit-gen2` writes CREDIT's
files (zarr yearly stores here) and a gen2 config; `credit check`, `credit train` and
`credit rollout --credit-config` read it as CREDIT reads it; CREDIT's own gen2 example files map
key by key, and what cannot be honoured is one line before any work."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest
from launches import credit_command
import xarray as xr
import yaml

from credit.config import compose_config
from credit.interop.config_file import map_credit_file

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
WHOLE_FILES = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "credit_configs"
                          / "whole_files.json").read_text())["files"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return credit_command(*args, env=ENV)


@pytest.fixture(scope="module")
def gen2_dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("credit_gen2") / "data"
    result = _cli("data", "generate", "--layout", "credit-gen2", "--format", "zarr", "--out", str(out), "--grid",
                  "8x16", "--years", "2000", "2001", "--levels", "500", "850", "--days-per-year", "3", "--no-progress")
    assert result.returncode == 0, result.stderr
    return out


def test_the_generated_files_are_credits_gen2_layout(gen2_dataset):
    conf = yaml.safe_load((gen2_dataset / "credit.yml").read_text())
    source = conf["data"]["source"]["ERA5"]
    assert source["variables"]["prognostic"]["path"].endswith("ERA5_gen2_6h_%Y.zarr")
    assert set(conf["validation_data"]) == set(conf["data"])  # CREDIT's gen2 loader requires every key
    assert [b["type"] for b in conf["preblocks"]["per_step"].values()] == ["era5_normalizer", "concat"]
    with xr.open_zarr(gen2_dataset / "ERA5_gen2_6h_2001.zarr") as ds:
        assert ds["U"].dims == ("time", "level", "latitude", "longitude")
        assert str(ds["time"].values[0])[:13] == "2001-01-01T00"
    with xr.open_dataset(conf["preblocks"]["per_step"]["norm"]["args"]["mean_path"]) as mean:
        assert mean["U"].dims == ("level",) and "Z_GDS4_SFC" in mean and "LSM" not in mean


def test_credit_check_accounts_for_every_key_and_resolves_the_layout(gen2_dataset):
    result = _cli("check", "--credit-config", str(gen2_dataset / "credit.yml"))
    assert result.returncode == 0, result.stderr[-2000:]
    conf = yaml.safe_load((gen2_dataset / "credit.yml").read_text())
    keys = [k for k in conf if k not in ("data", "trainer", "loss", "model")]
    keys += [f"{s}.{k}" for s in ("data", "trainer", "loss") for k in conf[s]]
    for key in keys:
        assert any(line.startswith((f"{key} ->", f"{key}:")) for line in result.stdout.splitlines()), key
    assert "layout: credit-gen2" in result.stdout and "timestep: 6h" in result.stdout


def test_train_then_rollout_from_the_gen2_config(gen2_dataset, tmp_path):
    run = tmp_path / "run"
    common = ["--credit-config", str(gen2_dataset / "credit.yml"), f"run_dir={run}", "model.dim=[16,32,64,128]",
              "model.dim_head=8"]
    trained = _cli("train", *common, "trainer.max_steps=2", "trainer.progress_bar=false")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "11 training samples" in trained.stdout + trained.stderr  # 12 six-hourly times, one target step
    forecast = _cli("rollout", *common, f"rollout.output_dir={tmp_path / 'forecasts'}")
    assert forecast.returncode == 0, forecast.stderr[-3000:]
    files = sorted((tmp_path / "forecasts").glob("*.nc"))
    assert [f.name for f in files] == ["forecast_2001-01-01T00.nc"]  # inference.batch_forecast's one init
    with xr.open_dataset(files[0]) as ds:
        assert ds.sizes["lead_time" if "lead_time" in ds.sizes else "time"] == 4  # forecast_length 1d at 6h
        assert {"U", "T", "SP", "t2m"} <= set(ds.data_vars)


def _refuses(conf: dict, tmp_path: Path, refusal: str) -> None:
    conf["save_loc"] = str(tmp_path / "run")
    config = tmp_path / "credit.yml"
    config.write_text(yaml.safe_dump(conf, sort_keys=False))  # CREDIT builds preblocks in file order
    result = _cli("train", "--credit-config", str(config))
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and refusal in errors[0], result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("path, change, refusal", [
    ("trainer.parallelism", {"data": "ddp", "tensor": 1, "domain": 2},
     "trainer.parallelism.domain: 2; CREDIT's domain parallelism computes long-distance attention within "
     "each shard"),
    ("trainer.parallelism", {"data": "ddp", "pipeline": 2}, "trainer.parallelism.pipeline"),
    ("data.date_ranges", [["2000-01-01", "2000-01-02"]], "data.date_ranges"),
    ("preblocks.per_step.norm.type", "rename", "preblocks.per_step.norm.type: 'rename'"),
    ("loss.type", "base", "loss.type: base scores the postblocks' physical units"),
    ("data.source.HRRR", {"dataset_type": "local"}, "data.source: 2 sources"),
    ("data.source.ERA5.variables.static.vars_3D", ["Z"], "data.source.ERA5.variables.static.vars_3D"),
])
def test_what_is_not_honoured_is_one_line_before_any_work(gen2_dataset, tmp_path, path, change, refusal):
    conf = copy.deepcopy(yaml.safe_load((gen2_dataset / "credit.yml").read_text()))
    *parents, last = path.split(".")
    for section in ("data", "validation_data") if path.startswith("data.source") else (parents[0],):
        node = conf[section]  # a source changes in both sections, as CREDIT's loader wants them
        for key in parents[1:]:
            node = node[key]
        node[last] = copy.deepcopy(change)
    _refuses(conf, tmp_path, refusal)


def test_credits_gen2_example_maps_key_by_key():
    """CREDIT's own gen2 example (normaliser preblocks, flat loss keys) maps with no refusal."""
    conf = WHOLE_FILES["config/gen_2/examples/wxformer_era5_025deg_6hr.yml"]
    mapping = map_credit_file(conf)
    assert mapping.refused == []
    cfg = compose_config([*mapping.overrides, "run_dir=/tmp/unused"])
    assert cfg.data.layout == "credit-gen2" and cfg.data.credit.timestep == "6h"
    assert cfg.data.train_period == ["1979-01-01T00:00:00", "2018-12-31T00:00:00"]  # a date is its 00Z
    assert cfg.data.valid_period == ["2018-01-01T00:00:00", "2019-12-31T00:00:00"]
    assert list(cfg.data.variables.static) == ["z_norm", "land_sea_mask"] and len(cfg.data.levels) == 13
    assert cfg.trainer.parallelism.data == "ddp" and cfg.trainer.grad_clip == 0.0  # 'dynamic' does not clip
    assert cfg.rollout.lead_steps == 4 and len(cfg.rollout.init_times) == 3  # 1d every 12 h, two days
    assert {"data.mean_path", "data.static_first", "data.one_shot"} <= set(mapping.ignored)


def test_credits_bridgescaler_example_maps_key_by_key():
    """CREDIT's current gen2 example: bridgescaler preblock and inverse postblocks, BaseLoss."""
    mapping = map_credit_file(WHOLE_FILES["config/gen_2/examples/example-v2026.2.yml"])
    assert [line for line in mapping.refused if "matches no file" not in line] == []
    cfg = compose_config([*mapping.overrides, "run_dir=/tmp/unused"])
    files = cfg.data.credit.files
    assert files.bridgescaler.endswith("ERA5_mlevel_1deg_6h_bridgescaler_pre.json") and files.mean is None
    assert files.bridgescaler_inverse == files.bridgescaler
    assert "toa_incident_solar_radiation" in cfg.data.credit.scaled_variables
    assert not set(cfg.data.variables.static) & set(cfg.data.credit.scaled_variables)  # statics as stored
    loss = cfg.trainer.loss
    assert (loss.space, loss.combine, loss.inverse_variance, loss.normalize_variable_weights,
            loss.latitude_weighting, loss.function) == ("physical", "variables", True, True, True, "mse")


def test_a_store_missing_a_chunk_is_one_line_before_any_step(gen2_dataset, tmp_path):
    """A zarr chunk deleted (or never written): xarray would read fill values and train on
    them; the store, variable and time are named before the first step, nothing written."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(gen2_dataset, data)
    conf = yaml.safe_load((data / "credit.yml").read_text().replace(str(gen2_dataset), str(data)))
    conf["save_loc"] = str(tmp_path / "run")
    config = tmp_path / "credit.yml"
    config.write_text(yaml.safe_dump(conf, sort_keys=False))
    (data / "ERA5_gen2_6h_2000.zarr" / "T" / "5.0.0.0").unlink()
    result = _cli("train", "--credit-config", str(config), "trainer.max_steps=1")
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-2000:]
    assert "ERA5_gen2_6h_2000.zarr: variable 'T' has no chunk for time 2000-01-02T06:00:00 (time index 5)" in errors[0]
    assert not [p for p in (tmp_path / "run").glob("*") if not p.name.startswith(".")]


def test_a_pointwise_transform_that_selects_nothing_is_ignored_as_credit_runs_it():
    """CREDIT's example-end-to-end.yml gives its log_transform preblock and exp_transform
    postblocks `variables` as a string: CREDIT iterates its characters, selects no variable and
    transforms nothing. Here such a block is ignored with its reason (as CREDIT runs it, a
    no-op), and so is one naming no variable of the data; one that selects a variable is read."""
    conf = copy.deepcopy(WHOLE_FILES["config/gen_2/examples/example-v2026.2.yml"])
    string = {"type": "log_transform", "args": {"variables": "ERA5/diagnostic/2d/total_precipitation"}}
    absent = {"type": "sqrt_transform", "args": {"variables": ["ERA5/prognostic/3d/no_such_variable"]}}
    conf["preblocks"]["per_step"] = {"log_trans": string, "sqrt": absent, **conf["preblocks"]["per_step"]}
    conf["postblocks"]["per_step"]["exp"] = {"type": "exp_transform",
                                            "args": {"variables": "ERA5/diagnostic/2d/total_precipitation"}}
    mapping = map_credit_file(conf)
    assert [line for line in mapping.refused if "matches no file" not in line] == []
    assert {"preblocks.per_step.log_trans", "preblocks.per_step.sqrt", "postblocks.per_step.exp"} <= set(mapping.ignored)
    assert any(line.startswith("preblocks.per_step.log_trans: ignored (its variables") and "characters" in line
               for line in mapping.lines), mapping.lines
    assert compose_config([*mapping.overrides, "run_dir=/tmp/unused"]).data.credit.files.bridgescaler
    conf["preblocks"]["per_step"]["log_trans"]["args"]["variables"] = ["ERA5/diagnostic/2d/total_precipitation"]
    mapping = map_credit_file(conf)
    assert "data.credit.transforms=[{kind:log,variables:[total_precipitation],base:e,eps:1e-08}]" in mapping.overrides


def test_flat_preblocks_read_as_credits_per_step_section_with_one_warning(gen2_dataset):
    """CREDIT's layout before its ic_only / per_step sections (its npj example keeps it): blocks
    by name, every one run each step, concat always last. Read as that per_step section (the
    same overrides as the file migrated by hand), with one line that says so; a file that mixes
    the two layouts is refused."""
    conf = yaml.safe_load((gen2_dataset / "credit.yml").read_text())
    sections = map_credit_file(conf)
    flat = copy.deepcopy(conf)
    flat["preblocks"] = {"norm": flat["preblocks"]["per_step"]["norm"]}  # no concat: CREDIT then always ran one
    mapped = map_credit_file(flat)
    assert mapped.refused == [] and mapped.overrides == sections.overrides
    assert sections.read_otherwise == [] and len(mapped.read_otherwise) == 1
    assert mapped.read_otherwise[0].startswith("preblocks: blocks by name")
    mixed = copy.deepcopy(conf)
    mixed["preblocks"]["norm"] = mixed["preblocks"]["per_step"].pop("norm")
    assert map_credit_file(mixed).refused[0].startswith("preblocks.norm: CREDIT's preblocks sections are")


def test_without_validation_data_validation_reads_the_data_period(gen2_dataset):
    """CREDIT's gen2 trainer validates on `data` when the file has no `validation_data` section."""
    conf = yaml.safe_load((gen2_dataset / "credit.yml").read_text())
    periods = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in map_credit_file(conf).overrides
               if o.startswith(("data.train_period=", "data.valid_period="))}
    assert periods["data.train_period"] != periods["data.valid_period"]
    del conf["validation_data"]
    periods = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in map_credit_file(conf).overrides
               if o.startswith(("data.train_period=", "data.valid_period="))}
    assert periods["data.train_period"] == periods["data.valid_period"]
