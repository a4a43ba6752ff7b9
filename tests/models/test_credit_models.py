"""CREDIT's own checkpoints load and forecast what CREDIT forecasts.

The fixtures (tests/fixtures/credit_reference, see its README) were made by running
CREDIT's model code: a checkpoint as CREDIT's trainer saves it, CREDIT's model config,
an input and CREDIT's eval-mode output. Acceptance: max |ours - CREDIT| / max |CREDIT|
<= 1e-5, in one process here and at tp=2 in tests/parallel/test_credit_tp.py.
"""

import logging
import re
from pathlib import Path

import pytest
import torch

from credit.models.credit.checkpoint import (CreditCheckpointError, from_credit, read_credit_model_section,
                                             read_credit_state_dict)
from credit.models.credit.config import build_credit_model, resolve_credit_model
from credit.models.credit.remap import remap_conv_state_dict

FIXTURES = Path(__file__).parent.parent / "fixtures" / "credit_reference"
NAMES = sorted(folder.name for folder in FIXTURES.iterdir() if (folder / "model.yml").exists())
# measured spread, CREDIT's forward against ours: 0.5-2.6e-6 over the eleven fixtures on the AVX2,
# scalar (ATEN_CPU_CAPABILITY=default) and MKL CNR (MKL_CBWR=COMPATIBLE, AVX) paths of a Zen 3,
# the CPU moving it by at most 4.5e-7; 1e-5 is 3.8x the largest
TOLERANCE = 1e-5


def relative_difference(ours: torch.Tensor, credit: torch.Tensor) -> float:
    return ((ours - credit).abs().max() / credit.abs().max()).item()


def forward_fixture(name: str) -> torch.Tensor:
    folder = FIXTURES / name
    model = from_credit(folder / "model.yml", folder / "checkpoint.pt")
    with torch.no_grad():
        return model(torch.load(folder / "input.pt"))


@pytest.mark.parametrize("name", NAMES)
def test_forward_matches_credit_in_one_process(name):
    credit = torch.load(FIXTURES / name / "output.pt")
    ours = forward_fixture(name)
    assert ours.shape == credit.shape
    assert relative_difference(ours, credit) <= TOLERANCE


def test_state_dict_keys_are_credits():
    """A Linear-format CREDIT checkpoint (today's nextgen_wxformer) has the model's keys and
    shapes exactly."""
    folder = FIXTURES / "wxformer_next_linear"
    credit = torch.load(folder / "checkpoint.pt", weights_only=False)["model_state_dict"]
    ours = from_credit(folder / "model.yml", folder / "checkpoint.pt").state_dict()
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in credit.items()}


def test_crossformer_keys_are_credits_in_linear_form():
    """CREDIT's older crossformer still stores 1x1 convolutions: its keys are the model's once
    q/k/v are split and the kernels squeezed (its unused cube embedding aside)."""
    folder = FIXTURES / "crossformer_frames2_diag"
    credit = remap_conv_state_dict(read_credit_state_dict(folder / "checkpoint.pt"))
    ours = from_credit(folder / "model.yml", folder / "checkpoint.pt").state_dict()
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in credit.items()}
    assert sum(k.endswith(".to_q.weight") for k in ours) == 2 * (1 + 1 + 2 + 1)


def test_conv_remap_is_idempotent_and_keeps_the_fused_sigma():
    state = read_credit_state_dict(FIXTURES / "wxformer_next_conv_sn" / "checkpoint.pt")
    once = remap_conv_state_dict(state)
    twice = remap_conv_state_dict(once)
    assert once.keys() == twice.keys()
    assert all(torch.equal(once[k], twice[k]) for k in once)
    assert not any(".to_qkv." in k or k.endswith("weight_orig") for k in once)
    stem = "layers.0.1.layers.0.0"
    fused_w = state[f"{stem}.to_qkv.weight_orig"].flatten(1).double()
    sigma = state[f"{stem}.to_qkv.weight_u"].double() @ fused_w @ state[f"{stem}.to_qkv.weight_v"].double()
    for proj in ("to_q", "to_k", "to_v"):
        w, u, v = (once[f"{stem}.{proj}.{s}"].double() for s in ("weight", "weight_u", "weight_v"))
        assert torch.allclose(u @ w @ v, sigma, rtol=1e-6)


def test_wrapped_and_bare_state_dicts_load(tmp_path):
    folder = FIXTURES / "wxformer_next_linear"
    state = torch.load(folder / "checkpoint.pt", weights_only=False)["model_state_dict"]
    torch.save({f"module.{k}": v for k, v in state.items()}, tmp_path / "ddp.pt")
    torch.save({f"_orig_mod.{k}": v for k, v in state.items()}, tmp_path / "bare.pt")
    credit = torch.load(folder / "output.pt")
    for file in ("ddp.pt", "bare.pt"):
        model = from_credit(folder / "model.yml", tmp_path / file)
        with torch.no_grad():
            assert relative_difference(model(torch.load(folder / "input.pt")), credit) <= TOLERANCE


@pytest.mark.parametrize("change, named", [
    ({"post_conf": {"activate": True, "skebs": {"activate": True}}}, "model.post_conf.skebs is active"),
    ({"post_conf": {"activate": True, "global_mass_fixer": {"activate": True, "simple_demo": True}}},
     "model.post_conf.global_mass_fixer.simple_demo=true"),
    ({"patch_height": 2}, "model.patch_height"),
    ({"output_frames": 2}, "model.output_frames"),
    ({"diffusion": True}, "model.diffusion"),
    ({"type": "unet"}, "model.type='unet' is another of CREDIT's model types"),
    ({"type": "wxformer_next"}, "model.type='wxformer_next' is not a CREDIT model type"),
])
def test_what_credit_acts_on_and_credit_does_not_is_refused_by_name(change, named):
    section = {**read_credit_model_section(FIXTURES / "crossformer_earthpad_sn" / "model.yml"), **change}
    with pytest.raises(ValueError, match=re.escape(named)):
        resolve_credit_model(section)


def test_credit_type_names_mean_credits_classes():
    """CREDIT's registry: crossformer = the older CrossFormer, wxformer and wxformer_base =
    the current one, nextgen_wxformer = NextGenWXFormer."""
    section = read_credit_model_section(FIXTURES / "crossformer_earthpad_sn" / "model.yml")
    built = {}
    for kind in ("crossformer", "wxformer", "wxformer_base"):
        name, values = resolve_credit_model({**section, "type": kind})
        built[kind] = type(build_credit_model(name, values)).__module__
    assert built == {"crossformer": "credit.models.credit.crossformer", "wxformer": "credit.models.credit.wxformer",
                     "wxformer_base": "credit.models.credit.wxformer"}


def test_keys_credit_ignores_are_ignored_with_one_warning(caplog):
    """CREDIT's current CrossFormer takes these through **kwargs and does nothing with them
    (as CREDIT's own example configs set them): the forecast is CREDIT's all the same."""
    folder = FIXTURES / "crossformer_earthpad_sn"
    section = {**read_credit_model_section(folder / "model.yml"), "upsample_v_conv": True,
               "decoder_attention_type": "scse", "frame_patch_size": 1, "attention_type": "scse_standard",
               "dims": [8, 16, 32, 64]}
    with caplog.at_level(logging.WARNING):
        model = from_credit(section, folder / "checkpoint.pt")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    for key in ("attention_type", "decoder_attention_type", "dims", "frame_patch_size", "upsample_v_conv"):
        assert f"model.{key}" in warnings[0]
    with torch.no_grad():
        out = model(torch.load(folder / "input.pt"))
    assert relative_difference(out, torch.load(folder / "output.pt")) <= TOLERANCE


def test_keys_credit_ignores_are_reported(caplog):
    section = {**read_credit_model_section(FIXTURES / "wxformer_next_linear" / "model.yml"),
               "padding_conf": {"activate": True, "mode": "earth", "pad_lat": [2, 2], "pad_lon": [2, 2]},
               "post_conf": {"activate": True}}  # NextGenWXFormer reads neither
    kind, values = resolve_credit_model(section)
    assert kind == "nextgen_wxformer" and "padding_conf" not in values
    assert "model.padding_conf" in caplog.text and "model.post_conf" in caplog.text


def test_a_checkpoint_of_another_shape_is_one_clear_error(tmp_path):
    folder = FIXTURES / "crossformer_frames2_diag"
    section = {**read_credit_model_section(folder / "model.yml"), "levels": 5}
    with pytest.raises(CreditCheckpointError, match=r"checkpoint.pt.*of another shape.*trained with"):
        from_credit(section, folder / "checkpoint.pt")
    (tmp_path / "broken.pt").write_bytes((folder / "checkpoint.pt").read_bytes()[:5000])
    with pytest.raises(CreditCheckpointError, match="broken.pt: not a readable torch checkpoint"):
        from_credit(folder / "model.yml", tmp_path / "broken.pt")


def test_an_input_of_another_layout_names_the_expected_one():
    folder = FIXTURES / "wxformer_next_linear"
    model = from_credit(folder / "model.yml", folder / "checkpoint.pt")
    with pytest.raises(ValueError, match=r"nextgen_wxformer expects input \(B, 21, 2, 32, 64\)"):
        model(torch.zeros(1, 21, 1, 32, 64))


def test_a_grid_wxformer_next_cannot_tile_names_the_window_and_the_grid_that_would():
    from credit.config import compose_config
    from credit.config.validate import ConfigError
    from credit.models import build_model

    cfg = compose_config([])  # the default nextgen_wxformer: strides 2 and windows up to 4
    layout = dict(in_channels=21, out_channels=18, state_channels=18, history_len=1, grid=(45, 90),
                  credit_channels=dict(channels=4, levels=4, surface_channels=2, input_only_channels=3,
                                       output_only_channels=0, frames=1, image_height=45, image_width=90))
    with pytest.raises(ConfigError) as info:
        build_model(cfg.model, **layout)
    message = str(info.value)
    assert "model.local_window_size[0]=4" in message and "22x45" in message
    assert "must divide by 16" in message and "model.padding_conf" in message and "\n" not in message
    layout.update(grid=(48, 96), credit_channels={**layout["credit_channels"], "image_height": 48, "image_width": 96})
    assert build_model(cfg.model, **layout)
