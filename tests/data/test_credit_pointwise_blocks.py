"""CREDIT's pointwise gen2 blocks against CREDIT's own code (tests/fixtures/credit_bridgescaler/
make_pointwise.py): `log_transform` of Q and of tp (base 10, eps 1e-6) and `sqrt_transform` of
SP before the bridgescaler, undone after its inverse by `exp_transform` and `square_transform`
on the prediction and its target twin. The samples, the example's BaseLoss through them, and
the forecast in physical units."""

from __future__ import annotations

import copy
import json
import math
import shutil

import numpy as np
import pytest
import torch
import xarray as xr
from test_credit_bridgescaler import DATA, FIXTURE, assert_loss_is, composed, credit_config

from credit.data.catalog import DataError
from credit.data.from_config import build_dataset
from credit.data.latitude import latitude_weights
from credit.data.target_statistics import as_fields
from credit.interop.bridgescaler_file import read_scaler_file
from credit.interop.config_file import map_credit_file
from credit.models.inputs import credit_input
from credit.interop.pointwise_blocks import Pointwise, blocks
from credit.train.losses import training_loss
from credit.train.validation import output_channel_variables

SCALER = FIXTURE / "scaler_pointwise.json"


@pytest.fixture(scope="module")
def expected() -> dict:
    return torch.load(FIXTURE / "expected_pointwise.pt")


# CREDIT's sample elements within the scaler's rounding (test_credit_bridgescaler.py), and for
# a transformed variable within one rounding more: log and sqrt are within 1 ulp of exact in
# torch's kernels, not correctly rounded, so two CPUs' values of the transform t may differ by
# 2 ulp (2 * 2^-23 |t|), which the scaler turns into 2^-22 |t| / sigma = 2^-22 |x + mu / sigma|.
SCALED_ROUNDING = 2.0 ** -20
TRANSFORMED = {"Q": "ERA5/prognostic/3d/Q", "SP": "ERA5/prognostic/2d/SP", "tp": "ERA5/diagnostic/2d/tp"}


def transform_rounding(names: list[str], data_type: str, channels: int):
    """For samples (channels, ...) of `data_type`: their elements' bound as above, from the
    scaler file's mean and variance of each transformed channel named in `names`."""
    scalers = {key: scaler for source in read_scaler_file(SCALER)[data_type].values()
               for key, scaler in dict(source).items()}
    offset = torch.full((channels,), float("nan"), dtype=torch.float64)  # mu / sigma; NaN: not transformed
    for channel, name in enumerate(names):
        variable, _, level = name.partition("_")
        if variable in TRANSFORMED and (level or name == variable):
            scaler = scalers[TRANSFORMED[variable]]
            mean, var = (np.asarray(scaler[k], dtype=np.float64).ravel() for k in ("mean_x_", "var_x_"))
            level_index = [n for n in names if n.partition("_")[0] == variable].index(name)
            offset[channel] = mean[level_index] / np.sqrt(var[level_index])

    def bound(expected: torch.Tensor) -> torch.Tensor:
        off = offset.view(-1, *[1] * (expected.dim() - 1))
        transformed = 2.0 ** -22 * (expected.double() + off).abs()
        return SCALED_ROUNDING + torch.where(off.isnan(), 0.0, transformed)
    return bound


def assert_within(ours: torch.Tensor, theirs: torch.Tensor, bound: torch.Tensor) -> None:
    difference = (ours.double() - theirs.double()).abs()
    worst = int((difference - bound).flatten().argmax())
    assert bool((difference <= bound).all()), (
        f"element {worst}: {difference.flatten()[worst]:.3g} over its bound {bound.flatten()[worst]:.3g}")


def pointwise_config(expected: dict, loss: bool = False) -> dict:
    conf = credit_config(SCALER, loss=dict(training_loss="mse", var_weighting="inverse_variance",
                                           normalize_weights=True, use_latitude_weights=True) if loss else None)
    conf["preblocks"]["per_step"] = {**copy.deepcopy(expected["preblocks"]), **conf["preblocks"]["per_step"]}
    if loss:
        post = conf["postblocks"]["per_step"]
        blocks = copy.deepcopy(expected["postblocks"])
        twins = {f"{n}_target": {"type": b["type"], "args": {**b["args"], "key": "y_target_processed"}}
                 for n, b in blocks.items()}
        conf["postblocks"]["per_step"] = {"reconstruct": post["reconstruct"], "scaler": post["scaler"], **blocks,
                                          "reconstruct_target": post["reconstruct_target"],
                                          "scaler_target": post["scaler_target"], **twins}
    return conf


def test_the_samples_are_credits_transformed_then_scaled(expected):
    """Each variable as read, through its log or sqrt (torch's float32 arithmetic as CREDIT's),
    then scaled with the file fitted on what they make: CREDIT's samples within the scaler's
    sqrt ulp (test_credit_bridgescaler.py) and the transforms' own rounding."""
    cfg = composed(pointwise_config(expected))
    assert [(b.kind, list(b.variables), b.base) for b in cfg.data.credit.transforms] == [
        ("log", ["Q"], "e"), ("log", ["tp"], "10"), ("sqrt", ["SP"], "e")]
    train = build_dataset(cfg.data, "train_period")
    x_bound = transform_rounding(train.state_channel_names, "input", expected["x"].shape[1])
    y_bound = transform_rounding(train.target_channel_names, "target", expected["y"].shape[1])
    for index in range(len(train)):
        sample = train[index]
        ours = credit_input(sample["state"][None], sample["forcing"][None, :1], sample["static"][None])[0]
        assert_within(ours, expected["x"][index], x_bound(expected["x"][index]))
        assert_within(sample["target"][0], expected["y"][index][:, 0], y_bound(expected["y"][index][:, 0]))
    # without the transforms the same file scales other values
    plain = composed(credit_config(SCALER))
    q = train.target_channel_names.index("Q_850")
    assert not torch.allclose(build_dataset(plain.data, "train_period")[0]["target"][0, q], train[0]["target"][0, q])


def test_the_loss_and_the_forecast_are_credits_through_the_inverse_blocks(expected):
    """BaseLoss on exp/square of the de-normalised prediction and target (value and gradient),
    and the de-normalised prediction through the same blocks (as forecasts are written) equal
    to CREDIT's postblocks' output, channel by channel."""
    cfg = composed(pointwise_config(expected, loss=True))
    assert [b.kind for b in cfg.data.credit.output_inverse] == ["exp", "exp", "square"]
    train = build_dataset(cfg.data, "train_period")
    v = cfg.data.variables
    channels = output_channel_variables(v.upper_air, train.levels, v.surface, v.diagnostic)
    loss_fn = training_loss(cfg.trainer.loss, channels, latitude_weights(train.latitude), train.target_std,
                            train.target_mean, train.output_inverse)
    assert_loss_is(loss_fn, expected, expected["loss"], expected["grad"], roundoffs=64)  # exp's rounding too
    denormalised = (expected["prediction"][:, :, 0].double() * torch.from_numpy(as_fields(train.target_std))
                    + torch.from_numpy(as_fields(train.target_mean)))
    physical = train.output_inverse(denormalised)
    for key, (start, stop) in expected["channels"].items():
        theirs = expected["physical"][key][:, :, 0].double()  # float32 arithmetic there, float64 here
        scale = theirs.abs().amax()
        assert ((physical[:, start:stop] - theirs).abs() / scale).max() < 1e-5, key


@pytest.mark.parametrize("base", ["e", "2", "10"])
def test_exp_undoes_log_and_square_undoes_sqrt(base):
    x = torch.tensor([0.0, 1e-9, 3e-4, 2.5, 1e5], dtype=torch.float64)
    log, exp = Pointwise("log", base, 1e-8), Pointwise("exp", base, 1e-8)
    assert log(torch.zeros(1)).item() == 0.0  # 0 stays 0, whatever the base
    torch.testing.assert_close(exp(log(x)), x, rtol=1e-12, atol=1e-20)
    torch.testing.assert_close(Pointwise("square")(Pointwise("sqrt")(x)), x, rtol=1e-12, atol=0)


def test_what_the_blocks_cannot_do_here_is_one_line(expected, tmp_path):
    """A transform after the scaler, an unknown base, one side only, an exp before the inverse
    scaler, a target twin without the prediction's blocks under loss.type base: one line each.
    Values outside a log's domain: one DataError naming the file, variable and time."""
    conf = pointwise_config(expected)
    per_step = conf["preblocks"]["per_step"]
    conf["preblocks"]["per_step"] = {"scaler": per_step.pop("scaler"), **per_step}
    assert map_credit_file(conf).refused[0].startswith(
        "preblocks.per_step.log_q: a log_transform after the bridgescaler_transform would act on normalised")
    conf = pointwise_config(expected)
    conf["preblocks"]["per_step"]["log_q"]["args"]["base"] = "3"
    assert map_credit_file(conf).refused[0].startswith("preblocks.per_step.log_q.args.base: '3'")
    conf = pointwise_config(expected)
    conf["preblocks"]["per_step"]["sqrt_sp"]["args"]["data_types"] = ["input"]
    assert map_credit_file(conf).refused[0].startswith("preblocks.per_step.sqrt_sp.args.data_types: ['input']")
    conf = pointwise_config(expected, loss=True)
    post = conf["postblocks"]["per_step"]
    conf["postblocks"]["per_step"] = {"reconstruct": post.pop("reconstruct"), "exp_q": post.pop("exp_q"), **post}
    assert map_credit_file(conf).refused[0].startswith(
        "postblocks.per_step.exp_q: a exp_transform of y_processed before an inverse scaler")
    conf = pointwise_config(expected, loss=True)
    del conf["postblocks"]["per_step"]["square_sp_target"]
    assert map_credit_file(conf).refused[0].startswith("postblocks.per_step: the target twin (y_target_processed)")
    # CREDIT's rollout de-normalises with inference.postblocks: other blocks there than in training
    conf = pointwise_config(expected, loss=True)
    post = conf["postblocks"]["per_step"]
    conf["inference"] = {"run_mode": "single", "single_forecast": {"start_datetime": "2000-12-31T00:00Z",
                                                                    "forecast_length": "12h"},
                         "postblocks": {"per_step": {k: post[k] for k in ("reconstruct", "scaler", "exp_q")}}}
    assert map_credit_file(conf).refused[0].startswith(
        "inference.postblocks: de-normalise forecasts otherwise than the training postblocks")
    conf["inference"]["postblocks"]["per_step"].update({k: post[k] for k in ("exp_tp", "square_sp")})
    assert not [r for r in map_credit_file(conf).refused if r.startswith("inference")]
    # U holds negative values: its log is NaN in CREDIT, one error here
    conf = pointwise_config(expected)
    conf["preblocks"]["per_step"]["log_q"]["args"]["variables"] = ["ERA5/prognostic/3d/U"]
    with pytest.raises(DataError, match=r"ERA5_all_2000.nc: log_transform of 'U' at 2000-.* gives nan from -[0-9.]+ "
                                        r".*CREDIT's log needs values > -eps"):
        build_dataset(composed(conf).data, "train_period")[0]


def test_fill_values_is_credits_on_nan_bounds_and_overlaps(expected):
    """Masks taken on the values as they come (NaN never meets a comparison), fills applied in
    rule order so the last matching rule wins: CREDIT's FillValues output, bit for bit."""
    fill = expected["fill"]
    conf = credit_config(SCALER)
    conf["preblocks"]["per_step"] = {"fill": {"type": "fill_values", "args": {"rules": fill["rules"]}},
                                     **conf["preblocks"]["per_step"]}
    cfg = composed(conf)
    (block, names), = blocks([dict(b) for b in cfg.data.credit.transforms])
    assert block.kind == "fill" and "SP" in names and block.rules[0][0] is None  # variables [] take every one
    assert torch.equal(block(fill["values"]), fill["filled"])


def test_stored_nan_filled_before_the_scaler_trains_and_unfilled_is_one_error(tmp_path):
    """Sea-surface fields carry NaN over land: a fill_values rule turns them into its value
    before the scaler (the sample is finite, those points (fill - mean) / std); without the
    rule the NaN is one error naming the file, variable and time."""
    data = tmp_path / "data"
    shutil.copytree(DATA, data)
    with xr.open_dataset(DATA / "ERA5_all_2000.nc") as ds:
        stored = ds.load()
    sp = stored["SP"].values.copy()
    sp[:, 2, 3] = np.nan
    stored["SP"] = (stored["SP"].dims, sp)
    stored.to_netcdf(data / "ERA5_all_2000.nc")
    conf = json.loads(json.dumps(credit_config(SCALER)).replace(str(DATA), str(data)))
    with pytest.raises(DataError, match=r"non-finite values .* in 'SP' of .*ERA5_all_2000.nc at time 2000-"):
        build_dataset(composed(conf).data, "train_period")[0]
    conf["preblocks"]["per_step"] = {"land": {"type": "fill_values", "args": {
        "rules": [{"search": "nan", "fill": 1.0e5}], "variables": ["ERA5/prognostic/2d/SP"]}},
        **conf["preblocks"]["per_step"]}
    filled = build_dataset(composed(conf).data, "train_period")
    clean = build_dataset(composed(credit_config(SCALER)).data, "train_period")
    channel = filled.target_channel_names.index("SP")
    a, b = filled[0]["target"][0, channel], clean[0]["target"][0, channel]
    mean, std = filled.target_mean[channel], filled.target_std[channel]
    assert bool(a.isfinite().all()) and math.isclose(float(a[2, 3]), (1.0e5 - mean) / std, rel_tol=1e-5)
    a[2, 3] = b[2, 3]
    assert torch.equal(a, b)
