"""The legacy convolutional layout against today's Linear model through `remap_conv_state_dict`."""

import pytest
import torch
from torch import nn

from tiny import SMALL_MODEL as SMALL

from credit.models import (
    LegacyWXFormer,
    RemapError,
    build_legacy_model,
    build_model,
    has_spectral_norm,
    remap_conv_state_dict,
)

LAYOUT = dict(in_channels=9, out_channels=7, state_channels=6, history_len=1, grid=(16, 32))
QKV = "stages.0.layers.0.0.to_qkv"


def pair(**cfg):
    """A legacy model with random weights, and today's model holding its remapped weights."""
    torch.manual_seed(0)
    legacy = build_legacy_model({**SMALL, **cfg}, **LAYOUT)
    with torch.no_grad():  # larger head: the transformer's part of the output is not negligible
        legacy.head.weight.mul_(10)
    converted = build_model({**SMALL, **cfg}, **LAYOUT)
    converted.load_state_dict(remap_conv_state_dict(legacy.state_dict()), strict=True)
    return legacy, converted


def test_legacy_state_dict_is_the_documented_layout():
    legacy = build_legacy_model(SMALL, **LAYOUT)
    assert isinstance(legacy, LegacyWXFormer)
    sd = legacy.state_dict()
    assert sd[f"{QKV}.weight"].shape == (48, 16, 1, 1) and f"{QKV}.bias" not in sd
    assert sd["stages.1.layers.0.2.to_out.weight"].shape == (32, 32, 1, 1)
    assert sd["stages.0.layers.0.1.up.weight"].shape == (64, 16, 1, 1)
    assert sd["stages.0.layers.0.3.down.weight"].shape == (16, 64, 1, 1)
    assert not any(".to_q." in k or ".to_k." in k for k in sd)
    # everything outside the transformer blocks is today's model, key for key
    today = build_model(SMALL, **LAYOUT).state_dict()
    outside = {k: v.shape for k, v in today.items() if ".layers." not in k}
    assert {k: sd[k].shape for k in outside} == outside


def test_converted_model_matches_outputs_and_gradients():
    legacy, converted = pair()
    x = torch.randn(2, 9, 16, 32)
    y_legacy, y_converted = legacy(x), converted(x)
    assert (y_legacy - y_converted).abs().max() <= 1e-6
    # features after the first transformer stage, where the projections act
    h = torch.randn(2, 16, 8, 16)
    assert (legacy.stages[0](h) - converted.stages[0](h)).abs().max() <= 1e-6

    y_legacy.square().mean().backward()
    y_converted.square().mean().backward()
    grads = remap_conv_state_dict({k: p.grad for k, p in legacy.named_parameters()})
    converted_grads = {k: p.grad for k, p in converted.named_parameters()}
    assert grads.keys() == converted_grads.keys()
    for name, grad in converted_grads.items():
        scale = grad.abs().max().clamp_min(1e-12)
        assert (grads[name] - grad).abs().max() <= 1e-5 * scale, name
        assert grads[name].shape == grad.shape


def test_a_wrong_mapping_is_detected_by_the_output_comparison():
    legacy, converted = pair()
    with torch.no_grad():  # swap q and k of one attention: the comparison must notice
        q = converted.stages[0].layers[0][0].to_q.weight.clone()
        converted.stages[0].layers[0][0].to_q.weight.copy_(converted.stages[0].layers[0][0].to_k.weight)
        converted.stages[0].layers[0][0].to_k.weight.copy_(q)
    x = torch.randn(2, 9, 16, 32)
    assert (legacy(x) - converted(x)).abs().max() > 1e-4


def test_remap_is_exact_and_idempotent():
    legacy = build_legacy_model(SMALL, **LAYOUT)
    sd = legacy.state_dict()
    once = remap_conv_state_dict(sd)
    fused = sd[f"{QKV}.weight"][:, :, 0, 0]
    for i, name in enumerate(("to_q", "to_k", "to_v")):
        assert torch.equal(once[f"stages.0.layers.0.0.{name}.weight"], fused[16 * i : 16 * (i + 1)])
    assert torch.equal(once["stages.0.layers.0.1.up.weight"], sd["stages.0.layers.0.1.up.weight"][:, :, 0, 0])
    # genuinely 4-D convolutions elsewhere are untouched, including the decoder's `up`
    for key in ("embeds.0.convs.0.weight", "ups.0.up.weight", "ups.0.conv.weight", "head.weight"):
        assert once[key].dim() == 4 and torch.equal(once[key], sd[key])
    twice = remap_conv_state_dict(once)
    assert twice.keys() == once.keys() and all(torch.equal(twice[k], once[k]) for k in once)
    today = build_model(SMALL, **LAYOUT).state_dict()
    assert remap_conv_state_dict(today).keys() == today.keys()
    assert f"{QKV}.weight" in sd  # the input is not modified


def test_fused_qkv_bias_is_split_in_three():
    bias = torch.arange(12.0)
    out = remap_conv_state_dict({"s.layers.0.0.to_qkv.bias": bias,
                                 "s.layers.0.0.to_qkv.weight": torch.randn(12, 5, 1, 1)})
    assert [out[f"s.layers.0.0.{p}.bias"].tolist() for p in ("to_q", "to_k", "to_v")] == [
        [0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


@pytest.mark.parametrize(
    "key, tensor, message",
    [
        ("s.layers.0.0.to_qkv.scale", torch.ones(3), r"s\.layers\.0\.0\.to_qkv\.scale: unknown suffix 'scale'"),
        ("s.layers.0.0.to_qkv.weight", torch.ones(10, 4, 1, 1), r"s\.layers\.0\.0\.to_qkv\.weight has shape \(10, 4\).*divisible by 3"),
        ("s.layers.0.1.up.weight", torch.ones(8, 4, 3, 3), r"s\.layers\.0\.1\.up\.weight has shape \(8, 4, 3, 3\)"),
        ("s.layers.0.1.down.bias", torch.ones(4, 1), r"s\.layers\.0\.1\.down\.bias has shape \(4, 1\)"),
    ],
)
def test_unexpected_suffix_or_shape_is_an_error_naming_the_key(key, tensor, message):
    with pytest.raises(RemapError, match=message):
        remap_conv_state_dict({key: tensor})


def test_fused_and_separate_qkv_together_is_an_error():
    with pytest.raises(RemapError, match=r"to_qkv\.weight and .*to_q\.weight both map to"):
        remap_conv_state_dict({"s.layers.0.0.to_q.weight": torch.ones(4, 4),
                               "s.layers.0.0.to_qkv.weight": torch.ones(12, 4, 1, 1)})


def _bake(model: nn.Module) -> dict:
    """Effective weights (raw weight / sigma from the stored u, v), u and v dropped."""
    model.eval()
    for module in model.modules():
        if hasattr(module, "weight_orig"):  # torch's hook style (the legacy model)
            nn.utils.remove_spectral_norm(module)
    baked = {}
    for name, module in model.named_modules():
        if has_spectral_norm(module):  # today's
            baked[f"{name}.weight"] = module.normalized_weight().detach()
    return {k: baked.get(k, v) for k, v in model.state_dict().items() if not k.endswith(("_u", "_v"))}


def test_spectral_norm_weights_map_exactly_and_differ_only_through_the_normalisation():
    torch.manual_seed(0)
    legacy = build_legacy_model({**SMALL, "use_spectral_norm": True}, **LAYOUT)
    legacy.train()
    legacy(torch.randn(1, 9, 16, 32))  # a power iteration: u, v are no longer the initial ones
    sd = legacy.state_dict()
    remapped = remap_conv_state_dict(sd)
    converted = build_model({**SMALL, "use_spectral_norm": True}, **LAYOUT)
    converted.load_state_dict(remapped, strict=True)

    # the stored tensors: weight_orig split exactly (as the raw `weight`), u split and rescaled
    # to unit length, v copied
    fused_w, fused_u, fused_v = (sd[f"{QKV}.{s}"] for s in ("weight_orig", "weight_u", "weight_v"))
    for i, name in enumerate(("to_q", "to_k", "to_v")):
        prefix = f"stages.0.layers.0.0.{name}"
        assert torch.equal(remapped[f"{prefix}.weight"], fused_w[16 * i : 16 * (i + 1), :, 0, 0])
        part = fused_u[16 * i : 16 * (i + 1)]
        assert torch.allclose(remapped[f"{prefix}.weight_u"], part / part.norm())
        assert torch.equal(remapped[f"{prefix}.weight_v"], fused_v)
    for key in ("stages.0.layers.0.0.to_out", "stages.0.layers.0.1.up", "embeds.0.convs.0"):
        assert torch.equal(remapped[f"{key}.weight_u"], sd[f"{key}.weight_u"])

    # what the models compute: every effective weight agrees except q/k/v, which are each
    # normalised by their own sigma instead of the fused matrix's -- a per-matrix scale
    baked_legacy, baked_converted = remap_conv_state_dict(_bake(legacy)), _bake(converted)
    scaled = 0
    for key, weight in baked_converted.items():
        reference = baked_legacy[key]
        if key.endswith((".to_q.weight", ".to_k.weight", ".to_v.weight")):
            ratio = reference / weight
            assert torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio), rtol=1e-5), key
            assert ratio.flatten()[0] < 1  # a part's sigma is below the fused matrix's
            scaled += 1
        else:
            assert torch.allclose(weight, reference, rtol=1e-6, atol=1e-7), key
    assert scaled == 3 * 4  # q, k, v of the 4 attentions
