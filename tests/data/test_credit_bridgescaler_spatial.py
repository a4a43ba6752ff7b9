"""CREDIT's per-grid-point scaling (`spatial_variables` of its bridgescaler blocks, as its
`example-end-to-end.yml` scales SP) against CREDIT's own code (tests/fixtures/
credit_bridgescaler/make_spatial.py): SP (prognostic) and tsi (an input) with one mean and
variance per grid point, the others per level; the samples, the example's BaseLoss behind
inverse postblocks naming the same variables, and the forecast's physical units."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_credit_bridgescaler import FIXTURE, assert_loss_is, assert_samples_are, composed, credit_config

from credit.data.catalog import DataError
from credit.data.from_config import build_dataset
from credit.data.latitude import latitude_weights
from credit.data.target_statistics import as_fields
from credit.interop.config_file import map_credit_file
from credit.train.losses import training_loss
from credit.train.validation import output_channel_variables

SCALER = FIXTURE / "scaler_spatial.json"
SP = "ERA5/prognostic/2d/SP"


@pytest.fixture(scope="module")
def expected() -> dict:
    return torch.load(FIXTURE / "expected_spatial.pt")


def spatial_config(scaler: Path = SCALER, loss: bool = False, spatial: list | None = None) -> dict:
    """The fixture's config with `spatial` (default: the fixture's) scaled per grid point, and
    with `loss` the example's BaseLoss behind inverse postblocks that scale SP per grid point."""
    conf = credit_config(scaler, loss=dict(training_loss="mse", var_weighting="inverse_variance",
                                           normalize_weights=True, use_latitude_weights=True) if loss else None)
    conf["preblocks"]["per_step"]["scaler"]["args"]["spatial_variables"] = list(spatial or [SP, "ERA5/dynamic_forcing/2d/tsi"])
    for block in dict(conf.get("postblocks", {}).get("per_step", {})).values():
        if block["type"] == "bridgescaler_transform":
            block["args"]["spatial_variables"] = [SP]
    return conf


def test_the_samples_are_credits_per_grid_point_scaling(expected):
    """SP and tsi take (x - mean) / sqrt(var) with the grid point's statistics (input and target
    sides their own), the others their level's: CREDIT's samples within sqrt's ulp, as in
    test_credit_bridgescaler.py."""
    cfg = composed(spatial_config())
    assert list(cfg.data.credit.spatial_variables) == ["SP", "tsi"]
    train = build_dataset(cfg.data, "train_period")
    assert len(train) == 15
    assert_samples_are(train, expected["x"], expected["y"])
    # the grid points' statistics differ, so a per-channel scaler would give other samples
    sp = train.target_channel_names.index("SP")
    assert train.target_std.shape == (len(train.target_channel_names), 9, 16)
    assert np.unique(train.target_std[sp]).size > 100 and np.unique(train.target_std[sp - 1]).size == 1


def test_the_loss_is_credits_base_loss_and_forecasts_are_its_physical_units(expected):
    """The example's BaseLoss (mse, inverse variance: SP's variance the mean over its grid
    points, latitude weights) on the fixture's prediction, value and gradient; and the
    prediction de-normalised as forecasts are equals CREDIT's inverse postblock's SP."""
    cfg = composed(spatial_config(loss=True))
    train = build_dataset(cfg.data, "train_period")
    v = cfg.data.variables
    channels = output_channel_variables(v.upper_air, train.levels, v.surface, v.diagnostic)
    loss_fn = training_loss(cfg.trainer.loss, channels, latitude_weights(train.latitude), train.target_std,
                            train.target_mean)
    assert_loss_is(loss_fn, expected, expected["loss"], expected["grad"])
    sp = slice(*expected["sp_channel"])
    physical = (expected["prediction"][:, sp, 0].double().numpy() * as_fields(train.target_std)[sp]
                + as_fields(train.target_mean)[sp])
    np.testing.assert_allclose(physical, expected["physical_sp"][:, :, 0].double().numpy(), rtol=2 ** -21, atol=0)


def test_what_credit_raises_on_is_one_line_naming_the_key():
    """Spatial variables outside `variables`, a 3-D one, history frames, or inverse blocks
    that scale per grid point other variables than the preblock: each one refusal line."""
    conf = spatial_config()
    conf["preblocks"]["per_step"]["scaler"]["args"]["variables"] = ["ERA5/prognostic/3d"]
    assert map_credit_file(conf).refused[0].startswith(
        "preblocks.per_step.scaler.args.spatial_variables: ['SP', 'tsi'] are not among the scaled variables")
    conf = spatial_config(spatial=["ERA5/prognostic/3d/T"])
    assert map_credit_file(conf).refused[0].startswith(
        "preblocks.per_step.scaler.args.spatial_variables: ERA5/prognostic/3d/T is 3-D")
    conf = spatial_config()
    conf["data"]["history_len"] = 2
    assert any(r.startswith("preblocks.per_step.scaler.args.spatial_variables with data.history_len > 1")
               for r in map_credit_file(conf).refused)
    conf = spatial_config(loss=True)
    conf["postblocks"]["per_step"]["scaler_target"]["args"]["spatial_variables"] = []
    assert map_credit_file(conf).refused[0].startswith(
        "postblocks.per_step.scaler_target.args.spatial_variables: []; the inverse must scale per grid point")


def test_a_scaler_not_fitted_per_grid_point_is_one_data_error(tmp_path):
    """The file's per-level SP scaler under `spatial_variables` (or a grid-point scaler of
    another grid): one DataError naming the file, variable and the sizes."""
    cfg = composed(spatial_config(FIXTURE / "scaler.json", spatial=[SP]))
    with pytest.raises(DataError, match=r"scaler.json: the input scaler of ERA5/prognostic/2d/SP holds 1 values; "
                                        r"scaled per grid point .* 9x16 grid it needs 144"):
        build_dataset(cfg.data, "train_period")
    scalers = json.loads(SCALER.read_text())
    scalers["input"]["ERA5"][SP] = json.loads((FIXTURE / "scaler.json").read_text())["input"]["ERA5"][SP]
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps(scalers))
    with pytest.raises(DataError, match=r"mixed.json: the input scaler of ERA5/prognostic/2d/SP holds 1 values"):
        build_dataset(composed(spatial_config(mixed, spatial=[SP])).data, "train_period")
    # and the per-grid-point file read without spatial_variables: its 144 values are not one channel
    with pytest.raises(DataError, match=r"input scaler of ERA5/prognostic/2d/SP holds 144 channels.*one per grid point: "
                                        r"the blocks' spatial_variables"):
        build_dataset(composed(credit_config(SCALER)).data, "train_period")
