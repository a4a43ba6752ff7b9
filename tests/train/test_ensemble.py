"""Ensembles on the batch axis (`trainer.ensemble_size`, credit/train/ensemble.py): CREDIT's
CRPS losses on the same tensors (tests/fixtures/credit_losses/crps.pt, made with CREDIT's
KCRPSLoss and AlmostFairKCRPSLoss; see crps_meta.json), members that agree, the keys'
refusals, and a training run whose members differ."""

import json
from pathlib import Path

import pytest
import torch

from credit.config import ConfigError, compose_config
from credit.config.validate import ENSEMBLE_LOSS_FUNCTIONS
from credit.models.dropout import dropout_step, keep_mask
from credit.train import run_training
from credit.train.ensemble import ENSEMBLE_FUNCTIONS, almost_fair_crps, kernel_crps, with_members
from credit.train.losses import ERRORS, WeightedLoss
from credit.train.metrics import read_metrics

FIXTURE = Path(__file__).parent.parent / "fixtures" / "credit_losses"
UNIT_ROUNDOFF = 2.0 ** -24


def test_the_config_names_are_the_modules():
    assert ENSEMBLE_LOSS_FUNCTIONS == ENSEMBLE_FUNCTIONS
    assert not set(ENSEMBLE_FUNCTIONS) & set(ERRORS)


def _members_last(prediction, target):
    m = prediction.shape[0] // target.shape[0]
    return torch.movedim(prediction.double().reshape(target.shape[0], m, *target.shape[1:]), 1, -1), m


def crps_rounding_bound(function: str, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per element, a bound on |fp32 CRPS - exact|: each term of a sum of n within one rounding
    (u = 2^-24) of its magnitude, the sum within (n - 1) u of the terms' magnitudes (any order),
    the divisions, the scale and the final difference one rounding each."""
    x, m = _members_last(prediction, target)
    y = target.double().unsqueeze(-1)
    skill_terms = (x - y).abs().sum(-1) / m
    skill = (m + 2) * UNIT_ROUNDOFF * skill_terms
    if function == "kcrps":
        spread_terms = (x.sort(-1).values * (2 * torch.arange(1, m + 1) - m - 1) / (m * (m - 1))).abs().sum(-1)
        spread = (m + 2) * UNIT_ROUNDOFF * spread_terms
    else:
        spread_terms = (x.unsqueeze(-1) - x.unsqueeze(-2)).abs().sum((-1, -2)) / (2 * m * (m - 1))
        spread = (m * m + 4) * UNIT_ROUNDOFF * spread_terms
    return skill + spread + UNIT_ROUNDOFF * (skill_terms + spread_terms)


@pytest.mark.parametrize("members", ["2", "3", "5"])
@pytest.mark.parametrize("function, alpha", [("kcrps", 1.0), ("almost_fair_crps", 1.0), ("almost_fair_crps", 0.95)])
def test_the_crps_is_credits_on_the_same_tensors(members, function, alpha):
    case = torch.load(FIXTURE / "crps.pt")[members]
    prediction, target = case["prediction"][:, :, 0], case["target"][:, :, 0]  # (B x m, C, lat, lon)
    reference = case["kcrps" if function == "kcrps" else f"almost_fair_crps_{alpha}"][:, :, 0]
    loss = WeightedLoss(torch.ones(target.shape[2]), torch.ones(target.shape[1]), function, crps_alpha=alpha)
    ours = loss.weighted_error(prediction, target)
    assert ours.shape == target.shape
    # CREDIT's run and ours each lie within the rounding bound of the exact value (which kernels
    # sum and sort is the CPU's), so within twice it of each other
    excess = ((ours.double() - reference.double()).abs() - 2 * crps_rounding_bound(function, prediction, target))
    assert excess.max() <= 0, float((ours - reference).abs().max())


def test_credits_kcrps_of_one_member_is_not_a_number():
    """What the refusal of a CRPS over one member says (CREDIT's gen1 trainers take it)."""
    assert json.loads((FIXTURE / "crps_meta.json").read_text())["one_member_kcrps_is_nan"] is True


@pytest.mark.parametrize("members", [2, 4])
def test_members_that_agree_score_their_absolute_error_exactly(members):
    gen = torch.Generator().manual_seed(1)
    target, forecast = torch.randn(3, 2, 4, 5, generator=gen), torch.randn(3, 2, 4, 5, generator=gen)
    agreeing = forecast.repeat_interleave(members, 0)
    absolute = (forecast - target).abs()
    # the pairwise spread is 0 exactly and the mean of a power of two of equal terms exact;
    # the sorted-member spread's weights (2i - m - 1) / (m (m - 1)) cancel exactly at m = 2 only
    assert torch.equal(almost_fair_crps(agreeing, target, 0.9), absolute)
    if members == 2:
        assert torch.equal(kernel_crps(agreeing, target), absolute)
    else:
        assert torch.allclose(kernel_crps(agreeing, target), absolute, rtol=0, atol=8 * UNIT_ROUNDOFF * 4)


def test_the_crps_is_lower_for_an_ensemble_that_spans_the_truth():
    target = torch.zeros(1, 1, 1, 1)
    spanning, biased = torch.tensor([-1.0, 1.0]).view(2, 1, 1, 1), torch.tensor([1.0, 1.0]).view(2, 1, 1, 1)
    # fair: mean |x_i - y| - sum_{i != j} |x_i - x_j| / (2 m (m - 1)) = 1 - 4 / 4 and 1 - 0
    assert float(kernel_crps(spanning, target)) == 0.0 and float(kernel_crps(biased, target)) == 1.0


def test_members_repeat_the_inputs_member_minor_and_keep_one_target():
    batch = {"state": torch.arange(2.0).view(2, 1), "forcing": torch.arange(2.0).view(2, 1),
             "static": torch.arange(2.0).view(2, 1), "target": torch.arange(2.0).view(2, 1),
             "skipped": torch.zeros(2)}
    members = with_members(batch, 3)
    for key in ("state", "forcing", "static"):
        assert members[key].flatten().tolist() == [0, 0, 0, 1, 1, 1]
    assert members["target"] is batch["target"] and with_members(batch, 1) is batch


@pytest.mark.parametrize("overrides, named", [
    (["trainer.ensemble_size=2"], "trainer.ensemble_size=2"),
    (["trainer.loss.function=kcrps"], "trainer.loss.function='kcrps'"),
    (["trainer.ensemble_size=0", "trainer.loss.function=kcrps"], "trainer.ensemble_size=0"),
    (["trainer.ensemble_size=2", "trainer.loss.function=kcrps", "trainer.loss.crps_alpha=0.9"],
     "trainer.loss.crps_alpha=0.9"),
    (["trainer.ensemble_size=2", "trainer.loss.function=almost_fair_crps", "trainer.loss.crps_alpha=0"],
     "trainer.loss.crps_alpha=0"),
    (["model=crossformer-ensemble", "data.history_len=2"], "data.history_len=2"),
    (["rollout.members=0"], "rollout.members=0"),
])
def test_a_bad_ensemble_key_is_one_error_naming_it(overrides, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        compose_config(overrides)


def test_an_ensemble_trains_and_its_members_differ_through_dropout(tmp_path, tiny_overrides):
    """Members forecast from the same inputs: without dropout they agree and the CRPS is the
    absolute error, the first step's loss mae's bitwise (deterministic mode: the model's bits
    do not depend on how many rows it sees); with dropout each member's rows draw their own
    masks (keyed on the global row: the sample and the member)."""
    first = {}
    common = ["trainer.max_steps=1", "trainer.valid_every_n_steps=0", "model.gemm=deterministic"]
    for name, extra in [("mae", ["trainer.loss.function=mae"]),
                        ("agree", ["trainer.ensemble_size=2", "trainer.loss.function=kcrps"]),
                        ("dropout", ["trainer.ensemble_size=2", "trainer.loss.function=kcrps",
                                     "model.attn_dropout=0.2", "model.ff_dropout=0.2"])]:
        run = tmp_path / name
        run_training(compose_config(tiny_overrides(run, *common, *extra)))
        first[name] = float(read_metrics(run / "metrics.csv")[0]["loss"])
    assert first["agree"] == first["mae"] > 0
    assert first["dropout"] != first["agree"]
    # validation runs without dropout: the members agree, their spread is 0
    assert float(read_metrics(tmp_path / "agree" / "metrics.csv", split="valid")[-1]["spread_t2m"]) == 0.0
    with dropout_step(seed=42, step=0, sample_offset=0, local_batch=2):  # one sample's two members
        keep = keep_mask((2, 3, 64), 0.5, layer=1)
    assert not torch.equal(keep[0], keep[1])


CROSSFORMER = ["model.dim=[8,16,32,64]", "model.dim_head=4", "model.local_window_size=[2,2,2,1]",
               "model.global_window_size=[2,2,1,1]"]


def test_credits_ensemble_fine_tunes_from_a_deterministic_crossformer(tmp_path, tiny_data, capfd):
    """CREDIT's workflow: a deterministic `crossformer` checkpoint (CREDIT's single-file format)
    starts `crossformer-ensemble`, whose noise layers start fresh and alone train (freeze)."""
    from tiny import tiny_data_overrides

    from credit.data.from_config import build_dataset
    from credit.data import model_layout
    from credit.models import build_model

    cfg = compose_config(tiny_data_overrides(tiny_data, "model=crossformer", *CROSSFORMER))
    layout = model_layout(cfg.data, build_dataset(cfg.data, "train_period"))
    deterministic = build_model(cfg.model, **layout)
    torch.save({"epoch": 0, "model_state_dict": deterministic.state_dict()}, tmp_path / "checkpoint.pt")
    run = tmp_path / "ensemble"
    run_training(compose_config(tiny_data_overrides(
        tiny_data, "model=crossformer-ensemble", *CROSSFORMER, "model.noise_latent_dim=4", "trainer.max_steps=2",
        "trainer.valid_every_n_steps=0", "trainer.ensemble_size=2", "trainer.loss.function=kcrps",
        f"trainer.resume={tmp_path / 'checkpoint.pt'}", f"run_dir={run}")))
    out = capfd.readouterr().out  # logs: stdout
    assert "noise weights start from their initialisation" in out and "no checkpoint to start from" not in out
    # from scratch, CREDIT's freeze would keep the CrossFormer at its random weights: one warning
    run_training(compose_config(tiny_data_overrides(
        tiny_data, "model=crossformer-ensemble", *CROSSFORMER, "model.noise_latent_dim=4", "trainer.max_steps=1",
        "trainer.valid_every_n_steps=0", "trainer.ensemble_size=2", "trainer.loss.function=kcrps",
        f"run_dir={tmp_path / 'scratch'}")))
    assert capfd.readouterr().out.count("model.freeze=true (CREDIT's default: fine-tuning) with no checkpoint") == 1
    rows = read_metrics(run / "metrics.csv")
    assert [r["step"] for r in rows if r["split"] == "train"] == ["1", "2"]
    valid = read_metrics(run / "metrics.csv", split="valid")[-1]  # the noise spreads the members
    assert float(valid["spread_t2m"]) > 0 and float(valid["rmse_t2m"]) > 0
