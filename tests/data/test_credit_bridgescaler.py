"""CREDIT's gen2 scaling and loss against CREDIT's own code (tests/fixtures/credit_bridgescaler,
made with its `make.py`): a bridgescaler file fitted as `credit preprocess` fits it, read by
NCAR's bridgescaler; the samples its `bridgescaler_transform` and `concat` preblocks make; and
its `loss.type: base` (BaseLoss) behind the inverse-scaler postblocks. The CREDIT config goes
through the mapping table and hydra composition, as `credit train --credit-config` takes it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from credit_fixtures import FP32_UNIT_ROUNDOFF, sum_rounding_bound

from credit.config import compose_config
from credit.data.catalog import DataError
from credit.data.from_config import build_dataset
from credit.data.latitude import latitude_weights
from credit.interop.config_file import map_credit_file
from credit.models.inputs import credit_input
from credit.train.losses import training_loss
from credit.train.validation import output_channel_variables

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE = FIXTURES / "credit_bridgescaler"
DATA = FIXTURES / "credit_gen2_data" / "data"
SCALER = "ERA5/prognostic", "ERA5/dynamic_forcing", "ERA5/diagnostic"
POSTBLOCKS = {"per_step": {
    "reconstruct": {"type": "reconstruct", "args": {"detach": False}},
    "scaler": {"type": "bridgescaler_transform", "args": {"scaler_path": "SCALER", "variables": [],
                                                          "method": "inverse_transform"}},
    "reconstruct_target": {"type": "reconstruct", "args": {"in_key": "y", "out_key": "y_target_processed"}},
    "scaler_target": {"type": "bridgescaler_transform",
                      "args": {"scaler_path": "SCALER", "variables": [], "method": "inverse_transform",
                               "key": "y_target_processed"}}}}


@pytest.fixture(scope="module")
def expected() -> dict:
    return torch.load(FIXTURE / "expected.pt")


def credit_config(scaler: Path = FIXTURE / "scaler.json", loss: dict | None = None) -> dict:
    """CREDIT's gen2 config of the fixture (`make.py`): the gen2 data fixture's variant A with
    the bridgescaler preblock, and with `loss` its BaseLoss behind the inverse postblocks."""
    base = torch.load(FIXTURES / "credit_gen2_data" / "expected_A.pt")["config"]
    conf = json.loads(json.dumps(base).replace("DATA/", f"{DATA}/"))
    conf["preblocks"] = {"per_step": {
        "scaler": {"type": "bridgescaler_transform",
                   "args": {"scaler_path": str(scaler), "variables": list(SCALER), "method": "transform",
                            "scaler_params": {"channels_last": False}}},
        "concat": {"type": "concat", "args": {"to_device": False}}}}
    if loss is not None:
        conf["postblocks"] = json.loads(json.dumps(POSTBLOCKS).replace("SCALER", str(scaler)))
        conf["loss"] = {"type": "base", "args": {**loss, "scaler_path": str(scaler),
                                                 "latitude_weights": str(DATA / "static.nc")}}
    return conf


def composed(conf: dict):
    mapping = map_credit_file(conf)
    assert mapping.refused == []
    return compose_config(list(mapping.overrides))


def assert_samples_are(train, x: torch.Tensor, y: torch.Tensor, rtol: float = 2 ** -22, atol: float = 0.0) -> None:
    """Every sample of `train` as model input (CREDIT's concat order) and target equals CREDIT's
    preblock output `x`, `y` within `rtol`/`atol`."""
    assert len(train) == len(x)
    for index in range(len(train)):
        sample = train[index]
        model_input = credit_input(sample["state"][None], sample["forcing"][None, :1], sample["static"][None])
        torch.testing.assert_close(model_input, x[index][None], rtol=rtol, atol=atol)
        torch.testing.assert_close(sample["target"][0], y[index][:, 0], rtol=rtol, atol=atol)


def assert_loss_is(loss_fn, expected: dict, loss: torch.Tensor, grad: torch.Tensor, roundoffs: int = 16) -> None:
    """`loss_fn` on the fixture's prediction and target gives CREDIT's `loss` within float32
    summation rounding (and `roundoffs` units for the weights) and its `grad` per channel."""
    prediction = expected["prediction"][:, :, 0].clone().requires_grad_(True)
    ours = loss_fn(prediction, expected["y"][:4, :, 0])
    ours.backward()
    tolerance = 2 * sum_rounding_bound(prediction.numel()) + roundoffs * FP32_UNIT_ROUNDOFF
    assert math.isclose(ours.item(), loss.item(), rel_tol=tolerance, abs_tol=0), (ours.item(), loss.item())
    grad = grad[:, :, 0]
    scale = grad.abs().amax(dim=(0, 2, 3), keepdim=True)  # per channel: the weights span 10 decades
    assert ((prediction.grad - grad).abs() / scale).max() < 1e-4


def test_the_samples_are_credits_bridgescaler_preblocks(expected):
    """Inputs with the file's input scalers, targets with its target scalers (fitted on other
    samples, so they differ), statics as stored: (x - mean) / sqrt(var) in float32 both sides.
    The subtraction and division are correctly rounded everywhere; torch's float32 sqrt is not
    (its AVX2 kernel is 1 ulp off for about a fifth of inputs) and CREDIT's bits follow the CPU
    that ran it, so: within sqrt's ulp (2^-23 relative) and the division's rounding (bitwise on
    the AVX2 machine that made the fixture)."""
    cfg = composed(credit_config())
    assert cfg.data.credit.files.bridgescaler.endswith("scaler.json") and cfg.data.credit.files.mean is None
    train = build_dataset(cfg.data, "train_period")
    assert len(train) == 15
    assert_samples_are(train, expected["x"], expected["y"])
    # the input and target sides of a variable differ, and so do the statistics de-normalising forecasts
    t_850 = train.state_channel_names.index("T_850")
    assert not torch.equal(expected["x"][1, t_850], expected["y"][0, t_850])


@pytest.mark.parametrize("name", ["example", "mae_none", "huber_manual", "mse_inverse_variance_weights"])
def test_the_loss_is_credits_base_loss_on_the_same_tensors(expected, name):
    """`loss.type: base` maps to trainer.loss (physical space, per-variable means, inverse
    variance weights) and gives BaseLoss's value and gradient on the fixture's prediction."""
    function, params, weighting, weights, normalize, latitude = expected["settings"][name]
    cfg = composed(credit_config(loss=dict(
        training_loss=function, base_loss_parameters=params, var_weighting=weighting, variable_weights=weights,
        normalize_weights=normalize, use_latitude_weights=latitude)))
    assert (cfg.trainer.loss.space, cfg.trainer.loss.combine) == ("physical", "variables")
    train = build_dataset(cfg.data, "train_period")
    v = cfg.data.variables
    channels = output_channel_variables(v.upper_air, train.levels, v.surface, v.diagnostic)
    loss_fn = training_loss(cfg.trainer.loss, channels, latitude_weights(train.latitude), train.target_std,
                            train.target_mean)
    # positive terms: each side's float32 sum is within sum_rounding_bound of the exact one, and
    # the weights (float32 cos(lat), 1/var from sqrt(var)^2) within a few units of roundoff
    assert_loss_is(loss_fn, expected, expected["losses"][name], expected["grads"][name])


def test_a_bridgescaler_file_that_cannot_scale_is_one_line(tmp_path):
    """A constant field's zero variance, another scaler kind, a missing file: one DataError
    naming the file and variable, before any sample."""
    scalers = json.loads((FIXTURE / "scaler.json").read_text())
    key = "ERA5/prognostic/2d/SP"
    inner = json.loads(scalers["target"]["ERA5"][key])
    inner["var_x_"] = {"__numpy__": "AAAAAA==", "dtype": "<f4", "shape": [1]}  # one float32 zero
    scalers["target"]["ERA5"][key] = json.dumps(inner)
    zero = tmp_path / "zero.json"
    zero.write_text(json.dumps(scalers))
    cfg = composed(credit_config(zero))
    with pytest.raises(DataError, match=r"zero.json: target scaler of ERA5/prognostic/2d/SP has variance 0.0"):
        build_dataset(cfg.data, "train_period")
    inner["type"] = "DMinMaxScalerTensor"
    scalers["target"]["ERA5"][key] = json.dumps(inner)
    other = tmp_path / "minmax.json"
    other.write_text(json.dumps(scalers))
    with pytest.raises(DataError, match=r"target scaler of ERA5/prognostic/2d/SP is a DMinMaxScalerTensor"):
        build_dataset(composed(credit_config(other)).data, "train_period")
    missing = composed(credit_config(tmp_path / "absent.json"))
    with pytest.raises(DataError, match=r"absent.json.* does not exist .*credit preprocess"):
        build_dataset(missing.data, "train_period")


def test_learnable_variable_weights_are_credits_base_loss():
    """`var_weighting: learnable` maps to trainer.loss.learnable_variance: the log-variances
    start where CREDIT's do (log of the postblocks' file's variances), and at those and at
    moved ones the loss and its gradients (prediction, log-variances) are BaseLoss's."""
    fixture = torch.load(FIXTURE / "expected_learnable.pt")
    cfg = composed(credit_config(loss=dict(training_loss="mse", var_weighting="learnable", use_latitude_weights=True,
                                           variable_weights=fixture["weights"])))
    assert cfg.trainer.loss.learnable_variance and not cfg.trainer.loss.inverse_variance
    train = build_dataset(cfg.data, "train_period")
    v = cfg.data.variables
    channels = output_channel_variables(v.upper_air, train.levels, v.surface, v.diagnostic)
    loss_fn = training_loss(cfg.trainer.loss, channels, latitude_weights(train.latitude), train.target_std,
                            train.target_mean)
    learned = loss_fn.learned
    assert learned.variables == [key.rsplit("/", 1)[1] for key in fixture["variables"]]  # CREDIT's order
    torch.testing.assert_close(learned.log_variance.detach(), fixture["start"]["log_variance"], rtol=0, atol=1e-5)
    expected = torch.load(FIXTURE / "expected.pt")
    for point in ("start", "moved"):
        case = fixture[point]
        with torch.no_grad():
            learned.log_variance.copy_(case["log_variance"])
        learned.zero_grad()
        prediction = fixture["prediction"][:, :, 0].clone().requires_grad_(True)
        ours = loss_fn(prediction, expected["y"][:4, :, 0])
        ours.backward()
        data_term = ours.item() - learned.penalty().item()  # positive; the penalty can cancel it
        tolerance = (2 * sum_rounding_bound(prediction.numel()) + 16 * FP32_UNIT_ROUNDOFF) * (
            abs(data_term) + abs(learned.penalty().item()))
        assert abs(ours.item() - case["loss"].item()) <= tolerance, (point, ours.item(), case["loss"].item())
        grad = case["grad"][:, :, 0]
        scale = grad.abs().amax(dim=(0, 2, 3), keepdim=True)
        assert ((prediction.grad - grad).abs() / scale).max() < 1e-4, point
        torch.testing.assert_close(learned.log_variance.grad, case["log_variance_grad"], rtol=1e-4, atol=1e-6)
        # deterministic mode's sums (variable by variable, by the fixed trees) and its s_v gradient
        learned.zero_grad()
        prediction.grad = None
        sums = loss_fn.sample_sums(prediction, expected["y"][:4, :, 0])
        (sums.sum() / prediction[0].numel() / len(sums)).backward()
        exact = sums.sum().item() / prediction[0].numel() / len(sums) + learned.penalty().item()
        assert abs(exact - case["loss"].item()) <= tolerance, (point, exact, case["loss"].item())
        assert ((prediction.grad - grad).abs() / scale).max() < 1e-4, point
        torch.testing.assert_close(learned.deterministic_gradient(None, 1), case["log_variance_grad"],
                                   rtol=1e-4, atol=1e-6)
    # validation's copy keeps the values it was made with, and no gradient reaches it
    frozen = loss_fn.for_validation()
    with torch.no_grad():
        learned.log_variance.add_(1.0)
    assert torch.equal(frozen.learned.log_variance + 1.0, learned.log_variance.detach())
    assert not frozen.learned.log_variance.requires_grad


def test_what_the_mapping_refuses_is_one_line_naming_the_key():
    conf = credit_config(loss=dict(training_loss="mse", var_weighting="uncertainty"))
    assert map_credit_file(conf).refused[0].startswith("loss.args.var_weighting: 'uncertainty'")
    conf = credit_config(loss=dict(training_loss="mse", var_weighting="learnable"))
    conf["loss"]["args"]["scaler_path"] = str(FIXTURE / "scaler_spatial.json")
    assert map_credit_file(conf).refused[0].startswith("loss.args.scaler_path:")
    conf = credit_config(loss=dict(training_loss="mse"))
    del conf["postblocks"]["per_step"]["scaler_target"]
    assert map_credit_file(conf).refused[0].startswith("loss.type: base scores the postblocks' physical units")
    conf = credit_config(loss=dict(training_loss="mse"))
    conf["postblocks"]["per_step"]["scaler"]["args"]["variables"] = ["ERA5/prognostic"]
    assert map_credit_file(conf).refused[0].startswith("postblocks.per_step.scaler.args.variables")


def test_the_inverse_postblocks_file_de_normalises_the_outputs(tmp_path, expected):
    """CREDIT's smoke config scales with one file and inverts with another: samples follow the
    preblock's file, forecasts (and physical-unit losses) the postblocks' target scalers."""
    scalers = json.loads((FIXTURE / "scaler.json").read_text())
    key = "ERA5/prognostic/2d/SP"
    inner = json.loads(scalers["target"]["ERA5"][key])
    inner["mean_x_"] = {"__numpy__": "AADIQg==", "dtype": "<f4", "shape": [1]}  # float32 100.0
    scalers["target"]["ERA5"][key] = json.dumps(inner)
    post = tmp_path / "post.json"
    post.write_text(json.dumps(scalers))
    conf = credit_config(loss=dict(training_loss="mse"))
    for block in ("scaler", "scaler_target"):
        conf["postblocks"]["per_step"][block]["args"]["scaler_path"] = str(post)
    conf["loss"]["args"]["scaler_path"] = str(post)
    cfg = composed(conf)
    assert cfg.data.credit.files.bridgescaler_inverse == str(post)
    train = build_dataset(cfg.data, "train_period")
    same = build_dataset(composed(credit_config()).data, "train_period")
    sp = train.target_channel_names.index("SP")
    assert train.target_mean[sp] == 100.0 != same.target_mean[sp]
    assert np.array_equal(np.delete(train.target_mean, sp), np.delete(same.target_mean, sp))
    assert torch.equal(train[3]["target"], same[3]["target"])  # normalised with the preblock's file


def test_a_string_selection_is_what_credit_makes_of_it():
    """CREDIT iterates `variables` as a list: a string is its characters, selecting nothing (its
    example-end-to-end.yml names one variable so). Refused with that reason, not read as one key."""
    conf = credit_config()
    conf["preblocks"]["per_step"]["scaler"]["args"]["variables"] = "ERA5/prognostic/2d/SP"
    refusal = map_credit_file(conf).refused[0]
    assert refusal.startswith("preblocks.per_step.scaler.args.variables: 'ERA5/prognostic/2d/SP' selects none")
    assert "list of its characters" in refusal


@pytest.mark.parametrize("made_by", ["fixture", "write_standard_scalers"])
def test_the_file_reads_as_bridgescaler_reads_it(tmp_path, made_by):
    """`read_scaler_file` (no bridgescaler import, so no numba compilation in every rank) gives
    every attribute bridgescaler's `load_scaler_dict` sets, with the same values and dtypes: on
    the fixture's file (written by CREDIT's scaler code) and on one this project writes."""
    from bridgescaler import load_scaler_dict

    from credit.interop.bridgescaler_file import read_scaler_file, write_standard_scalers

    path = FIXTURE / "scaler.json"
    if made_by == "write_standard_scalers":
        path = tmp_path / "written.json"
        write_standard_scalers(path, {"input": {"ERA5/prognostic/3d/T": (np.arange(3.0) + 250, np.ones(3) * 12.5)},
                                      "target": {"ERA5/prognostic/2d/SP": (np.array([1e5]), np.array([900.0]))}})
    theirs, ours = load_scaler_dict(str(path)), read_scaler_file(path)
    assert theirs.keys() == ours.keys() and all(theirs[t].keys() == ours[t].keys() for t in theirs)
    compared = 0
    for data_type, sources in theirs.items():
        for source, scalers in sources.items():
            assert scalers.keys() == ours[data_type][source].keys()
            for key, scaler in scalers.items():
                fields = ours[data_type][source][key]
                assert fields["type"] == type(scaler).__name__
                assert set(fields) - {"type"} == set(vars(scaler)), key
                for name, value in vars(scaler).items():
                    mine = fields[name]
                    if isinstance(value, torch.Tensor):
                        assert isinstance(mine, np.ndarray | np.generic) and torch.equal(torch.tensor(mine), value), name
                        compared += 1
                    else:
                        assert mine == value and type(mine) is type(value), (key, name, mine, value)
    assert compared >= 2 * 2  # at least the mean and variance of two scalers


def test_per_variable_loss_overrides_are_credits():
    """`base_loss_overrides` (tp by mae, SP by huber with delta 0.5, T by logcosh; the rest by
    the example's mse) maps to trainer.loss.overrides and gives BaseLoss's value and gradient;
    without them the loss differs."""
    overrides = torch.load(FIXTURE / "expected_overrides.pt")
    conf = credit_config(loss=dict(training_loss="mse", var_weighting="inverse_variance", normalize_weights=True,
                                   use_latitude_weights=True, base_loss_overrides=overrides["overrides"]))
    cfg = composed(conf)
    assert dict(cfg.trainer.loss.overrides["SP"]) == {"function": "huber", "huber_delta": 0.5}
    train = build_dataset(cfg.data, "train_period")
    v = cfg.data.variables
    channels = output_channel_variables(v.upper_air, train.levels, v.surface, v.diagnostic)
    loss_fn = training_loss(cfg.trainer.loss, channels, latitude_weights(train.latitude), train.target_std,
                            train.target_mean)
    expected = torch.load(FIXTURE / "expected.pt")
    assert torch.equal(expected["prediction"], overrides["prediction"])
    assert_loss_is(loss_fn, expected, overrides["loss"], overrides["grad"])
    plain = training_loss(composed(credit_config(loss=dict(training_loss="mse"))).trainer.loss, channels,
                          latitude_weights(train.latitude), train.target_std, train.target_mean)
    prediction = expected["prediction"][:, :, 0]
    assert not math.isclose(plain(prediction, expected["y"][:4, :, 0]).item(), overrides["loss"].item(), rel_tol=1e-3)
    conf["loss"]["args"]["base_loss_overrides"] = {"ERA5/diagnostic/2d/tp": {"loss": "KCRPS"}}
    assert map_credit_file(conf).refused[0].startswith("loss.args.base_loss_overrides.ERA5/diagnostic/2d/tp.loss: 'KCRPS'")
