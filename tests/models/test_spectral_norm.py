"""Spectral norm in one process: torch's hook-style spectral norm as the reference, buffers
that EMA and the optimizer leave alone, u/v advancing once per optimizer step, and the
whole model. Sharded layouts: tests/parallel/test_spectral_norm_tp.py."""

import copy

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from tiny import SMALL_MODEL as SMALL

from credit.models import EMA, advance_spectral_norm, apply_spectral_norm, build_model, has_spectral_norm
from credit.models.spectral_norm import spectral_normalize

LAYOUT = dict(in_channels=9, out_channels=6, state_channels=6, history_len=1, grid=(16, 32))


def _pair(layer: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(ours, torch's hook style) with the same weights and the same u, v."""
    ours = copy.deepcopy(layer)
    spectral_normalize(ours, deterministic=False)
    ref = nn.utils.spectral_norm(copy.deepcopy(layer))
    with torch.no_grad():
        ref.weight_u.copy_(ours.weight_u)
        ref.weight_v.copy_(ours.weight_v)
    return ours, ref


@pytest.mark.parametrize("make, shape", [
    (lambda: nn.Linear(48, 80), (5, 48)),
    (lambda: nn.Conv2d(6, 10, kernel_size=3, padding=1), (2, 6, 8, 8)),
    (lambda: nn.ConvTranspose2d(6, 10, kernel_size=2, stride=2), (2, 6, 4, 4)),
])
def test_matches_torch_hook_style_spectral_norm_over_training_steps(make, shape):
    torch.manual_seed(0)
    ours, ref = _pair(make())
    # after the initial power iterations the normalised weight has spectral norm ~1
    matrix = ours.normalized_weight().detach()
    matrix = matrix.transpose(0, ours.sn_dim).reshape(matrix.shape[ours.sn_dim], -1)
    assert torch.linalg.matrix_norm(matrix, ord=2).item() == pytest.approx(1.0, rel=2e-2)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.05)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05)
    for step in range(5):
        x = torch.randn(shape)
        advance_spectral_norm(ours)
        y, y_ref = ours(x), ref(x)
        # within 1e-5 of the output's largest entry: the two orders of the same float32 sums
        # differ by a few ulps of the largest terms, more than 1e-5 relative near zero
        assert (y - y_ref).abs().max() <= 1e-5 * y_ref.abs().max(), step
        y.square().sum().backward()
        y_ref.square().sum().backward()
        # elementwise within 1e-5 of the gradient's largest entry (sums reassociate)
        scale = ref.weight_orig.grad.abs().max()
        assert (ours.weight.grad - ref.weight_orig.grad).abs().max() <= 1e-5 * scale
        opt_ours.step(), opt_ref.step()
        opt_ours.zero_grad(), opt_ref.zero_grad()
    torch.testing.assert_close(ours.weight_u, ref.weight_u, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.weight_v, ref.weight_v, rtol=1e-5, atol=1e-6)


def test_u_v_advance_once_per_optimizer_step_and_only_in_training():
    torch.manual_seed(0)
    layer = spectral_normalize(nn.Linear(32, 64), deterministic=False)
    x = torch.randn(4, 32)
    u0 = layer.weight_u.clone()
    layer(x)  # nothing due: no advance
    assert torch.equal(layer.weight_u, u0)
    advance_spectral_norm(layer)
    layer.eval()
    layer(x)  # eval: no advance, still due
    assert torch.equal(layer.weight_u, u0) and layer.sn_due
    layer.train()
    with torch.no_grad():
        layer.weight.add_(0.5 * torch.randn_like(layer.weight))  # so an advance moves u
    sigma_first = layer(x)
    u1 = layer.weight_u.clone()
    assert not torch.equal(u1, u0)
    assert torch.equal(layer(x), sigma_first)  # second micro-batch: same u, v, same sigma
    assert torch.equal(layer.weight_u, u1)


def test_activation_checkpointing_recompute_sees_the_same_sigma():
    torch.manual_seed(0)
    plain = spectral_normalize(nn.Linear(32, 64), deterministic=False)
    checked = copy.deepcopy(plain)
    x = torch.randn(4, 32, requires_grad=True)
    with torch.no_grad():
        plain.weight.add_(0.5 * torch.randn_like(plain.weight))
        checked.weight.copy_(plain.weight)
    for layer in (plain, checked):
        advance_spectral_norm(layer)
    plain(x).square().sum().backward()
    checkpoint(checked, x, use_reentrant=False).square().sum().backward()
    assert torch.equal(plain.weight.grad, checked.weight.grad)
    assert torch.equal(plain.weight_u, checked.weight_u)


def test_u_v_are_buffers_that_ema_and_the_optimizer_leave_alone():
    torch.manual_seed(0)
    model = build_model({**SMALL, "use_spectral_norm": True}, **LAYOUT)
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    q = "stages.0.layers.0.0.to_q"
    assert f"{q}.weight" in params and f"{q}.weight_u" in buffers and f"{q}.weight_v" in buffers
    assert not any(name.endswith(("weight_u", "weight_v", "weight_orig")) for name in params)
    ema = EMA(model, decay=0.5)
    assert not any(name.endswith(("weight_u", "weight_v")) for name in ema.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.5)
    advance_spectral_norm(model)
    model(torch.randn(2, 9, 16, 32)).square().mean().backward()
    opt.step()
    ema.update(model)
    after_step = {k: v.clone() for k, v in model.named_buffers() if k.endswith(("weight_u", "weight_v"))}
    ema.copy_to(model)  # weights become the averages; u, v stay the live ones
    for name, value in model.named_buffers():
        if name in after_step:
            assert torch.equal(value, after_step[name]), name


def test_every_layer_of_the_model_is_normalised_and_receives_gradients():
    torch.manual_seed(0)
    model = build_model({**SMALL, "use_spectral_norm": True}, **LAYOUT)
    layers = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d, nn.ConvTranspose2d))]
    assert layers and all(has_spectral_norm(m) for m in layers)
    advance_spectral_norm(model)
    model(torch.randn(2, 9, 16, 32)).square().mean().backward()
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(ValueError, match="already spectral-normalised"):
        spectral_normalize(layers[0], deterministic=False)
    assert apply_spectral_norm(model) is model  # idempotent over a normalised model


def test_deterministic_products_agree_with_torch_to_rounding():
    torch.manual_seed(0)
    layer = nn.Linear(64, 96)
    torch.manual_seed(1)  # the same initial u, v draws
    fast = spectral_normalize(copy.deepcopy(layer), deterministic=False)
    torch.manual_seed(1)
    det = spectral_normalize(copy.deepcopy(layer), deterministic=True)
    torch.testing.assert_close(det.weight_u, fast.weight_u, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(det.sigma(), fast.sigma(), rtol=1e-6, atol=0)
