"""CREDIT's `crossformer-ensemble` (CrossFormerWithNoise) built here: its checkpoints load
with CREDIT's keys and forecast CREDIT's numbers for the same noise (tests/fixtures/
credit_ensemble, made with CREDIT's class: every torch.randn of its forward recorded), it
freezes what CREDIT freezes, and its own noise is a function of the member's place in the
global batch, not of the rank."""

import json
from pathlib import Path

import pytest
import torch

from credit.models.credit.checkpoint import from_credit
from credit.models.dropout import dropout_step
from credit.models.noise import indexed_normal

FIXTURES = Path(__file__).parent.parent / "fixtures" / "credit_ensemble"
CASES = sorted(folder.name for folder in FIXTURES.iterdir() if (folder / "model.yml").exists())
# the spread of CREDIT's forward against ours over the CrossFormer fixtures
# (tests/models/test_credit_models.py: TOLERANCE, measured over CPU code paths)
TOLERANCE = 1e-5


def _recorded(folder: Path):
    noise = torch.load(folder / "noise.pt")

    def source(shape, layer, forward, device):
        assert tuple(noise[layer].shape) == tuple(shape), (layer, tuple(noise[layer].shape), shape)
        return noise[layer]

    return source


@pytest.mark.parametrize("case", CASES)
def test_forward_is_credits_for_its_recorded_noise(case):
    folder = FIXTURES / case
    model = from_credit(folder / "model.yml", folder / "checkpoint.pt")  # strict: CREDIT's keys, every one
    model.noise_source = _recorded(folder)
    model.eval()
    with torch.no_grad():
        ours = model(torch.load(folder / "input.pt"))
    credit = torch.load(folder / "output.pt")
    assert ((ours - credit).abs().max() / credit.abs().max()).item() < TOLERANCE


@pytest.mark.parametrize("case", CASES)
def test_it_trains_what_credit_trains(case):
    """freeze: only the noise layers' weights train (their noise_factor never does); CREDIT
    also counts a cube embedding it never calls (152 weights here: credit_models.md)."""
    folder = FIXTURES / case
    model = from_credit(folder / "model.yml", folder / "checkpoint.pt")
    meta = json.loads((folder / "meta.json").read_text())
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == meta["trainable"] - (
        0 if meta["trainable"] < 2000 else 152)
    assert not any(name.endswith("noise_factor") for name in trainable)
    if meta["trainable"] < 2000:  # frozen
        assert trainable and all(name.startswith(("encoder_noise_layers.", "noise_inject")) for name in trainable)


def test_its_noise_is_the_members_on_any_placement_and_new_each_forward():
    """Rows are (sample, member) pairs of the global batch: ranks holding rows 2..3 draw
    what one process draws there; another forward or layer draws other noise."""
    with dropout_step(seed=5, step=3, sample_offset=0, local_batch=4):
        whole = indexed_normal((4, 3, 8, 8), layer=1, forward=0)
        other_forward = indexed_normal((4, 3, 8, 8), layer=1, forward=1)
        other_layer = indexed_normal((4, 3, 8, 8), layer=2, forward=0)
    with dropout_step(seed=5, step=3, sample_offset=2, local_batch=2):
        part = indexed_normal((2, 3, 8, 8), layer=1, forward=0)
    assert torch.equal(whole[2:], part)
    assert not torch.equal(whole, other_forward) and not torch.equal(whole, other_layer)
    with dropout_step(seed=5, step=3, sample_offset=0, local_batch=64):
        many = indexed_normal((64, 4, 32, 32), layer=0, forward=0).double()
    assert abs(float(many.mean())) < 0.01 and abs(float(many.std()) - 1) < 0.01


def test_without_the_step_context_it_says_so():
    folder = FIXTURES / CASES[0]
    model = from_credit(folder / "model.yml", folder / "checkpoint.pt")
    with pytest.raises(RuntimeError, match="step context"):
        model(torch.load(folder / "input.pt"))


def test_a_deterministic_crossformers_checkpoint_starts_it_as_credit_loads_it(caplog):
    """CREDIT fine-tunes its ensemble from a deterministic CrossFormer: the checkpoint lacks the
    noise layers (CREDIT loads strict=False and warns). With their modulation at 0 the noise adds
    nothing, so the model forecasts CREDIT's deterministic CrossFormer's numbers."""
    import yaml

    folder = FIXTURES.parent / "credit_reference" / "crossformer_old_convtranspose"
    section = yaml.safe_load((folder / "model.yml").read_text())["model"]
    section.update(type="crossformer-ensemble", noise_latent_dim=4)
    model = from_credit({"model": section}, folder / "checkpoint.pt")
    assert "start from their initialisation" in caplog.text
    with torch.no_grad():
        for layer in [*model.encoder_noise_layers, model.noise_inject1, model.noise_inject2, model.noise_inject3]:
            layer.modulation.zero_()
    inputs = torch.load(folder / "input.pt")
    with dropout_step(seed=0, step=0, sample_offset=0, local_batch=inputs.shape[0]), torch.no_grad():
        ours = model(inputs)
    credit = torch.load(folder / "output.pt")
    assert ((ours - credit).abs().max() / credit.abs().max()).item() < TOLERANCE
