"""The windowformer: shapes, residual output, padding, declared TP plans and their constraints."""

import pytest
import torch
from torch import nn

from tiny import SMALL_MODEL as SMALL

from credit.models import WindowFormer, build_model
from credit.models.padding import EarthPad
from credit.models.windowformer.model import Attention, FeedForward
from credit.parallel.tensor_parallel import _check_block, planned_blocks



def small_model(grid=(16, 32), history_len=1, state=6, diagnostic=0, **overrides):
    cfg = {**SMALL, **overrides}
    return build_model(
        cfg,
        in_channels=history_len * state + 3,
        out_channels=state + diagnostic,
        state_channels=state,
        history_len=history_len,
        grid=grid,
    )


@pytest.mark.parametrize("grid", [(16, 32), (18, 36), (181, 360)])
def test_output_shape_on_any_grid(grid):
    torch.manual_seed(0)
    model = small_model(grid=grid, diagnostic=1)
    x = torch.randn(2, model.spec.in_channels, *grid)
    y = model(x)
    assert y.shape == (2, 7, *grid)
    assert torch.isfinite(y).all()


def test_wrong_input_shape_is_a_clear_error():
    model = small_model()
    with pytest.raises(ValueError, match=r"expects input \(B, 9, 16, 32\)"):
        model(torch.randn(1, 8, 16, 32))


@pytest.mark.parametrize("history_len", [1, 2])
def test_residual_adds_change_to_last_input_frame(history_len):
    torch.manual_seed(0)
    model = small_model(history_len=history_len, diagnostic=2)
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(torch.arange(8, dtype=torch.float32))
    x = torch.randn(3, model.spec.in_channels, 16, 32)
    y = model(x)
    last = x[:, (history_len - 1) * 6 : history_len * 6]
    expected_state = last + torch.arange(6, dtype=torch.float32).view(1, 6, 1, 1)
    torch.testing.assert_close(y[:, :6], expected_state, rtol=0, atol=0)
    assert torch.all(y[:, 6] == 6.0) and torch.all(y[:, 7] == 7.0)


def test_every_planned_path_is_a_linear_and_every_transformer_block_has_a_plan():
    model = small_model(depth=[2, 1])
    planned = planned_blocks(model)
    # 2 attentions + 2 feed-forwards per round; rounds = 2 + 1
    assert len(planned) == 4 * 3
    kinds = {type(m) for _, m in planned}
    assert kinds == {Attention, FeedForward}
    for _, module in planned:
        assert set(module._tp_plan.values()) <= {"colwise", "rowwise"}
        for path in module._tp_plan:
            assert isinstance(module.get_submodule(path), nn.Linear), path
        if isinstance(module, Attention):
            assert callable(module._tp_constraints)


def test_tp_constraints_name_heads_and_allowed_degrees():
    attention = Attention(dim=48, dim_head=8, window=2, kind="local", dropout=0.0)  # 6 heads
    Attention._tp_constraints(attention, 2)
    Attention._tp_constraints(attention, 3)
    with pytest.raises(ValueError, match=r"6 heads.*tensor=4.*\[1, 2, 3, 6\]"):
        Attention._tp_constraints(attention, 4)
    ff = FeedForward(dim=6, mult=1, dropout=0.0)
    with pytest.raises(ValueError, match=r"ff\.up \(colwise\) has out_features=6, not divisible by "
                                         r"trainer\.parallelism\.tensor=4"):
        _check_block("ff", ff, 4)


@pytest.mark.parametrize("kind", ["local", "global"])
def test_head_count_follows_local_width_so_column_shards_sum_to_the_full_output(kind):
    """A rank holding half of q/k/v's columns (half the heads) and half of to_out's inputs
    computes a partial output; the two partials add up to the serial attention."""
    torch.manual_seed(0)
    full = Attention(dim=32, dim_head=8, window=2, kind=kind, dropout=0.0)
    x = torch.randn(2, 4, 8, 32)
    expected = full(x)
    total = torch.zeros_like(expected)
    for rank in range(2):
        part = Attention(dim=32, dim_head=8, window=2, kind=kind, dropout=0.0)
        rows = slice(rank * 16, (rank + 1) * 16)
        with torch.no_grad():
            part.norm.load_state_dict(full.norm.state_dict())
            for name in ("to_q", "to_k", "to_v"):
                getattr(part, name).weight = nn.Parameter(getattr(full, name).weight[rows].clone())
                getattr(part, name).out_features = 16
            part.to_out.weight = nn.Parameter(full.to_out.weight[:, rows].clone())
            part.to_out.in_features = 16
            part.to_out.bias.copy_(full.to_out.bias if rank == 0 else torch.zeros(32))
        total += part(x)
    torch.testing.assert_close(total, expected, rtol=1e-5, atol=1e-6)


def test_earth_padding_wraps_longitude_and_reflects_across_the_poles():
    x = torch.arange(6 * 8, dtype=torch.float32).view(1, 1, 6, 8)
    pad = EarthPad((6, 8), multiple=4)  # pads to 8 x 8: one row each side, no columns
    assert pad.pad_lat == (1, 1) and pad.pad_lon == (0, 0)
    y = pad(x)
    assert y.shape == (1, 1, 8, 8)
    torch.testing.assert_close(y[0, 0, 0], torch.roll(x[0, 0, 0], 4))  # across the north pole
    torch.testing.assert_close(y[0, 0, -1], torch.roll(x[0, 0, -1], 4))  # across the south pole
    torch.testing.assert_close(pad.crop(y), x)
    wide = EarthPad((4, 6), multiple=4)  # pads longitude 6 -> 8: one column each side
    z = wide(torch.arange(24.0).view(1, 1, 4, 6))
    assert wide.pad_lon == (1, 1)
    torch.testing.assert_close(z[0, 0, :, 0], torch.arange(24.0).view(4, 6)[:, -1])
    torch.testing.assert_close(z[0, 0, :, -1], torch.arange(24.0).view(4, 6)[:, 0])


def test_padding_none_requires_a_divisible_grid():
    with pytest.raises(ValueError, match="grid height 18 is not divisible by 8"):
        small_model(grid=(18, 32), padding="none")
    assert small_model(grid=(16, 32), padding="none")(torch.randn(1, 9, 16, 32)).shape[-2:] == (16, 32)


def test_spectral_norm_keeps_the_raw_weight_beside_u_and_v():
    torch.manual_seed(0)
    model = small_model(use_spectral_norm=True)
    keys = model.state_dict().keys()
    q = "stages.0.layers.0.0.to_q"
    assert {f"{q}.weight", f"{q}.weight_u", f"{q}.weight_v"} <= set(keys)
    assert not any(k.endswith("weight_orig") for k in keys)
    model(torch.randn(1, 9, 16, 32)).sum().backward()
    assert model.stages[0].layers[0][0].to_q.weight.grad is not None


def test_unknown_model_key_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"model\.dropout"):
        small_model(dropout=0.1)
    with pytest.raises(ValueError, match="model.name='unet'"):
        small_model(name="unet")


def test_every_parameter_receives_a_gradient():
    torch.manual_seed(0)
    model = small_model()
    model(torch.randn(2, 9, 16, 32)).square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    assert not missing
    assert isinstance(model, WindowFormer)
