"""CREDIT's `geopotential_diagnostic` postblock and BaseLoss's computed diagnostics against
CREDIT's own code: the geopotential of random columns (tests/fixtures/credit_geopotential, made
with its `make.py`) and the example's BaseLoss scoring it beside the outputs
(tests/fixtures/credit_bridgescaler/expected_geopotential.pt, made with `make_geopotential.py`);
the mapping of the postblock pair, its refusals, and the level file's errors."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
import xarray as xr
from launches import credit_command
from test_credit_bridgescaler import DATA, FIXTURE, assert_loss_is, composed, credit_config

from credit.config import compose_config
from credit.config.validate import ConfigError, validate_config
from credit.data.catalog import DataError
from credit.data.from_config import build_dataset
from credit.data.latitude import latitude_weights
from credit.interop.command_line import credit_file_overrides
from credit.interop.config_file import map_credit_file
from credit.interop.geopotential import ComputedGeopotential, geopotential, read_level_info
from credit.train.losses import training_loss
from credit.train.validation import output_channel_variables

GEO_FIXTURE = FIXTURE.parent / "credit_geopotential"
LEVEL_INFO = GEO_FIXTURE / "level_info.nc"
WHOLE_FILES = json.loads((FIXTURE.parent / "credit_configs" / "whole_files.json").read_text())["files"]
EPS = 2.0 ** -24


def _bound(levels: int, magnitude: torch.Tensor) -> torch.Tensor:
    """How far float32 arithmetic on another CPU may land from CREDIT's bits: a few roundings
    per level (log, product, sum) of terms no larger than the result, accumulated over the
    column's levels (log's vector kernels differ by an ulp across CPUs)."""
    return 8 * (levels + 1) * EPS * magnitude


@pytest.mark.parametrize("case", ["all_levels", "some_levels", "surface_first"])
def test_the_geopotential_is_credits_postblock(case):
    expected = torch.load(GEO_FIXTURE / "expected.pt")["cases"][case]
    inputs = {k: v[:, :, 0] for k, v in expected["inputs"].items()}  # CREDIT's (batch, level, time, lat, lon)
    a_half, b_half = read_level_info(LEVEL_INFO, levels=expected["levels"])
    ours = geopotential(inputs["surface_geopotential"], inputs["surface_pressure"], inputs["temperature"],
                        inputs["specific_humidity"], a_half, b_half, expected["flip_vertical"])
    reference = expected["geopotential"][:, :, 0]
    levels = reference.shape[1]
    assert ((ours - reference).abs() <= _bound(levels, reference.abs().amax())).all()
    # the integral runs upward from the surface: the top level holds the largest geopotential
    top = 0 if expected["flip_vertical"] else -1
    assert bool((reference[:, top] == reference.amax(dim=1)).all())


def test_the_channels_it_reads_are_the_named_variables():
    """ComputedGeopotential picks T, Q and SP from a channel layout (the target order) and the
    static surface geopotential it was given: the same values as the columns given directly."""
    expected = torch.load(GEO_FIXTURE / "expected.pt")["cases"]["some_levels"]
    inputs = {k: v[:, :, 0] for k, v in expected["inputs"].items()}
    physical = torch.cat([inputs["specific_humidity"], torch.ones_like(inputs["surface_pressure"]),
                          inputs["temperature"], inputs["surface_pressure"]], dim=1)
    names = ["Q"] * 4 + ["other"] + ["T"] * 4 + ["SP"]
    section = {"output": "geopotential", "surface_pressure": "SP", "temperature": "T", "specific_humidity": "Q",
               "flip_vertical": True, "level_info_file": str(LEVEL_INFO), "a_half_variable": "a_half",
               "b_half_variable": "b_half", "levels": [3, 4, 5, 6]}
    computed = ComputedGeopotential(section, names, inputs["surface_geopotential"][0, 0].numpy())
    assert computed.levels == 4 and computed.name == "geopotential"
    a_half, b_half = read_level_info(LEVEL_INFO, levels=[3, 4, 5, 6])
    direct = geopotential(inputs["surface_geopotential"], inputs["surface_pressure"], inputs["temperature"],
                          inputs["specific_humidity"], a_half, b_half)
    assert torch.equal(computed(physical), direct)
    with pytest.raises(DataError, match="9 interface coefficients; the data.s 4 levels of T need 5"):
        ComputedGeopotential({**section, "levels": None}, names, inputs["surface_geopotential"][0, 0].numpy())


def _geopotential_config(include: bool = True, scaler: str = "scaler.json", **changes) -> dict:
    """The bridgescaler fixture's example BaseLoss with make_geopotential.py's postblocks."""
    block = torch.load(FIXTURE / "expected_geopotential.pt")["postblock"]
    conf = credit_config(FIXTURE / scaler, loss=dict(training_loss="mse", var_weighting="inverse_variance", normalize_weights=True,
                                   use_latitude_weights=True, include_computed_diagnostics=include))
    args = {**block["args"], **changes}
    conf["postblocks"]["per_step"]["geopotential"] = {"type": block["type"], "args": args}
    conf["postblocks"]["per_step"]["geopotential_target"] = {"type": block["type"],
                                                             "args": {**args, "key": "y_target_processed"}}
    return conf


def test_the_loss_scores_the_computed_geopotential_as_credits_base_loss():
    """The postblock pair and `include_computed_diagnostics` map to data.credit.geopotential;
    the loss takes BaseLoss's value and gradient with the geopotential of prediction and target
    scored as one more variable (weight 1 before normalising: the scaler file has no statistics
    for it); the computed field is CREDIT's. Without the pair, the loss is another."""
    expected = torch.load(FIXTURE / "expected_geopotential.pt")
    cfg = composed(_geopotential_config())
    assert cfg.data.credit.geopotential.output == "geopotential"
    assert (cfg.data.credit.geopotential.temperature, cfg.data.credit.geopotential.surface_geopotential) == \
        ("T", "Z_GDS4_SFC")
    train = build_dataset(cfg.data, "train_period")
    v = cfg.data.variables
    channels = output_channel_variables(v.upper_air, train.levels, v.surface, v.diagnostic)
    loss_fn = training_loss(cfg.trainer.loss, channels, latitude_weights(train.latitude), train.target_std,
                            train.target_mean, train.output_inverse, train.computed_output)
    assert loss_fn.chan_weights.shape[1] == len(channels) + 3
    bridgescaler = torch.load(FIXTURE / "expected.pt")
    assert_loss_is(loss_fn, bridgescaler, expected["loss"], expected["grad"])
    prediction = bridgescaler["prediction"][:, :, 0]
    physical = prediction * loss_fn.std + loss_fn.mean
    reference = expected["geopotential"][:, :, 0]
    assert ((train.computed_output(physical) - reference).abs() <= _bound(3, reference.abs().amax())).all()
    plain = training_loss(cfg.trainer.loss, channels, latitude_weights(train.latitude), train.target_std,
                          train.target_mean, train.output_inverse)
    assert not math.isclose(plain(prediction, bridgescaler["y"][:4, :, 0]).item(), expected["loss"].item(),
                            rel_tol=1e-3)


def test_a_scaler_of_the_computed_key_weighs_it_as_base_loss_does():
    """A scaler file with a target scaler of the output key: BaseLoss divides the
    geopotential's weight by that scaler's variance (the mean over its levels)."""
    expected = torch.load(FIXTURE / "expected_geopotential.pt")["with_variance"]
    cfg = composed(_geopotential_config(scaler="scaler_geopotential.json"))
    assert cfg.data.credit.geopotential.output_key == "ERA5/computed_diagnostic/3d/geopotential"
    train = build_dataset(cfg.data, "train_period")
    assert math.isclose(train.computed_output.variance, expected["variance"], rel_tol=2 ** -22)
    v = cfg.data.variables
    channels = output_channel_variables(v.upper_air, train.levels, v.surface, v.diagnostic)
    loss_fn = training_loss(cfg.trainer.loss, channels, latitude_weights(train.latitude), train.target_std,
                            train.target_mean, train.output_inverse, train.computed_output)
    assert_loss_is(loss_fn, torch.load(FIXTURE / "expected.pt"), expected["loss"], expected["grad"])


def test_deterministic_mode_counts_the_computed_channels():
    """The per-sample mean and the backward seed divide by every scored element, the computed
    channels' included: the deterministic validation loss equals the fast one."""
    cfg = composed(_geopotential_config())
    train = build_dataset(cfg.data, "train_period")
    v = cfg.data.variables
    channels = output_channel_variables(v.upper_air, train.levels, v.surface, v.diagnostic)
    loss_fn = training_loss(cfg.trainer.loss, channels, latitude_weights(train.latitude), train.target_std,
                            train.target_mean, train.output_inverse, train.computed_output)
    bridgescaler = torch.load(FIXTURE / "expected.pt")
    prediction, target = bridgescaler["prediction"][:1, :, 0], bridgescaler["y"][:1, :, 0]
    assert loss_fn.elements(target[0]) == (len(channels) + 3) * target[0, 0].numel()
    assert math.isclose(loss_fn.sample_mean(prediction, target).item(), loss_fn(prediction, target).item(),
                        rel_tol=1e-5)


@pytest.mark.parametrize("change, message", [
    (dict(static_source_key="x_raw"), "postblocks.per_step.geopotential.args.static_source_key: 'x_raw'"),
    (dict(temperature_var="ERA5/prognostic/2d/SP"), "postblocks.per_step.geopotential.args.temperature_var"),
    (dict(surface_geopotential_var="ERA5/static/2d/nothing"),
     "postblocks.per_step.geopotential.args.surface_geopotential_var"),
    (dict(output_name="ERA5/computed_diagnostic/3d/T"), "postblocks.per_step.geopotential.args.output_name"),
    (dict(output_name="geopotential"), "postblocks.per_step.geopotential.args.output_name"),
    (dict(spline=True), "postblocks.per_step.geopotential.args.spline: not an argument"),
    (dict(levels="5-7"), "postblocks.per_step.geopotential.args.levels"),
])
def test_what_the_mapping_refuses_is_one_line_naming_the_key(change, message):
    refused = map_credit_file(_geopotential_config(**change)).refused
    assert len(refused) == 1 and refused[0].startswith(message), refused


def test_the_pair_and_the_flag_decide_what_is_scored():
    """Only the prediction's postblock with computed diagnostics scored: refused (BaseLoss would
    find no target); twins with other arguments: refused; include_computed_diagnostics false:
    ignored with its reason, nothing computed; a pointwise block after the postblock: refused."""
    conf = _geopotential_config()
    del conf["postblocks"]["per_step"]["geopotential_target"]
    assert map_credit_file(conf).refused[0].startswith("postblocks.per_step.geopotential: "
                                                       "loss.args.include_computed_diagnostics scores")
    conf = _geopotential_config()
    conf["postblocks"]["per_step"]["geopotential_target"]["args"]["flip_vertical"] = False
    assert "the same arguments but key" in map_credit_file(conf).refused[0]
    mapping = map_credit_file(_geopotential_config(include=False))
    assert mapping.refused == [] and not any("geopotential=" in o for o in mapping.overrides)
    assert any("no loss scores here" in line for line in mapping.lines)
    conf = _geopotential_config()
    conf["postblocks"]["per_step"]["exp"] = {"type": "exp_transform", "args": {"variables": ["ERA5/prognostic/3d/Q"]}}
    assert map_credit_file(conf).refused[0].startswith("postblocks.per_step.exp: a exp_transform of y_processed "
                                                       "after its geopotential_diagnostic")


def test_a_level_file_that_cannot_serve_is_one_line(tmp_path):
    with pytest.raises(DataError, match="'ERA5_Lev_Info.nc' is not a file .a bare name is a file of CREDIT's package, credit/metadata/ERA5_Lev_Info.nc"):
        read_level_info("ERA5_Lev_Info.nc")
    with pytest.raises(DataError, match="has no variable 'a_model'"):
        read_level_info(LEVEL_INFO, a_variable="a_model")
    with pytest.raises(DataError, match=r"levels \[8, 9\] must be model levels 1..8"):
        read_level_info(LEVEL_INFO, levels=[8, 9])
    conf = _geopotential_config()
    for block in ("geopotential", "geopotential_target"):
        conf["postblocks"]["per_step"][block]["args"].pop("levels")  # the file's 8 levels, the data's 3
    cfg = composed(conf)
    with pytest.raises(DataError, match="level_info.nc: 9 interface coefficients; the data's 3 levels of T need 4"):
        build_dataset(cfg.data, "train_period")


def fitted_smoke_model() -> dict:
    """CREDIT's smoke model section sized to the fixture's 9 x 16 grid and its channel counts."""
    return {**WHOLE_FILES["config/gen_2/smoke/smoke_gen2_casper.yml"]["model"],
            "levels": 3, "surface_channels": 2, "input_only_channels": 3, "output_only_channels": 1,
            "image_height": 9, "image_width": 16, "local_window_size": 1,
            "global_window_size": [2, 1, 1, 1], "cross_embed_kernel_sizes": [[2, 4]] * 4,
            "padding_conf": {"activate": True, "mode": "earth", "pad_lat": [4, 3], "pad_lon": [0, 0]}}


def test_a_bare_level_file_is_the_checkouts_and_validation_guards_the_section(tmp_path):
    """CREDIT's default `ERA5_Lev_Info.nc` is found in `credit/metadata` of the checkout that
    holds the config; the section needs the physical-unit, per-variable loss."""
    checkout = tmp_path / "miles-credit"
    (checkout / "credit" / "metadata").mkdir(parents=True)
    xr.open_dataset(LEVEL_INFO).to_netcdf(checkout / "credit" / "metadata" / "ERA5_Lev_Info.nc")
    conf = _geopotential_config(level_info_file="ERA5_Lev_Info.nc")
    conf["model"] = fitted_smoke_model()
    config_file = checkout / "config" / "mine.yml"
    config_file.parent.mkdir()
    config_file.write_text(json.dumps(conf))
    overrides, _ = credit_file_overrides(["--credit-config", str(config_file)])
    cfg = compose_config([o for o in overrides if not o.startswith("model")])
    assert cfg.data.credit.geopotential.level_info_file == str(checkout / "credit" / "metadata" / "ERA5_Lev_Info.nc")
    assert np.isfinite(build_dataset(cfg.data, "train_period").computed_output.a_half.numpy()).all()
    cfg.trainer.loss.space = "normalized"
    with pytest.raises(ConfigError, match="data.credit.geopotential.output"):
        validate_config(cfg)


def test_a_surface_pressure_at_or_below_zero_is_named_when_the_loss_is_nan():
    """CREDIT's arithmetic gives NaN where interface pressures reach zero; the field keeps it,
    and says which surface pressure it met."""
    expected = torch.load(GEO_FIXTURE / "expected.pt")["cases"]["some_levels"]
    inputs = {k: v[:, :, 0] for k, v in expected["inputs"].items()}
    names = ["Q"] * 4 + ["T"] * 4 + ["SP"]
    section = {"output": "geopotential", "surface_pressure": "SP", "temperature": "T", "specific_humidity": "Q",
               "flip_vertical": True, "level_info_file": str(LEVEL_INFO), "a_half_variable": "a_half",
               "b_half_variable": "b_half", "levels": [3, 4, 5, 6]}
    computed = ComputedGeopotential(section, names, inputs["surface_geopotential"][0, 0].numpy())
    physical = torch.cat([inputs["specific_humidity"], inputs["temperature"], inputs["surface_pressure"]], dim=1)
    assert computed.why_not_finite() is None  # nothing computed yet
    assert torch.isfinite(computed(physical)).all() and computed.why_not_finite() is None
    physical[0, -1, 0, 0] = -3000.0  # one interface pressure below zero: still a number
    assert torch.isfinite(computed(physical)).all() and computed.why_not_finite() is None
    physical[0, -1, 0, 0] = -3e6  # two adjacent ones: zero over zero
    assert not torch.isfinite(computed(physical)).all()
    assert computed.why_not_finite().startswith(
        "the computed geopotential (data.credit.geopotential) met a surface pressure SP of -3e+06 Pa")


def test_a_run_whose_prediction_makes_the_field_nan_stops_naming_it(tmp_path):
    """The fixture's config with CREDIT's smoke crossformer, untrained: its first prediction's
    surface pressure goes below zero, the loss is NaN (as in CREDIT), and the error says why."""
    conf = _geopotential_config(level_info_file=str(LEVEL_INFO))
    conf["model"] = fitted_smoke_model()
    conf["save_loc"] = str(tmp_path / "run")
    (tmp_path / "geo.yml").write_text(json.dumps(conf))
    run = credit_command("train", "--credit-config", tmp_path / "geo.yml", "trainer.max_steps=1",
                         "trainer.batch_size=1")
    assert run.returncode != 0
    assert re.search(r"error: loss became nan at step 1 \(the step's inputs and targets were all finite; the "
                     r"computed geopotential \(data.credit.geopotential\) met a surface pressure SP of -[0-9.e+]+ Pa",
                     run.stderr), run.stderr[-2000:]
