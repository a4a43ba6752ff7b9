"""Indexed dropout masks: a function of (seed, step, layer, global element), not of layout."""

import pytest
import torch

from credit.models.dropout import IndexedDropout, dropout_step, keep_mask


def test_a_rank_block_draws_what_the_serial_run_draws_there():
    with dropout_step(seed=7, step=3, sample_offset=0, local_batch=8):
        full = keep_mask((8, 40, 96), 0.1, layer=2)
    with dropout_step(seed=7, step=3, sample_offset=4, local_batch=4):  # dp rank 1 of 2
        rows = keep_mask((4, 40, 96), 0.1, layer=2)
    with dropout_step(seed=7, step=3, sample_offset=0, local_batch=8):  # tp rank 2 of 4
        cols = keep_mask((8, 40, 24), 0.1, layer=2, col_offset=48, global_cols=96)
    assert torch.equal(rows, full[4:]) and torch.equal(cols, full[..., 48:72])


def test_masks_keep_one_minus_p_and_change_with_step_layer_and_seed():
    def mask(seed=7, step=3, layer=2):
        with dropout_step(seed=seed, step=step, sample_offset=0, local_batch=16):
            return keep_mask((16, 256, 128), 0.25, layer=layer).float()

    base = mask()
    assert abs(base.mean().item() - 0.75) < 0.01
    for other in (mask(step=4), mask(layer=3), mask(seed=8)):
        assert abs((other != base).float().mean().item() - 2 * 0.25 * 0.75) < 0.01
    flat = base.view(-1, 128)
    neighbours = torch.corrcoef(torch.stack([flat[:, :-1].flatten(), flat[:, 1:].flatten()]))[0, 1]
    assert abs(neighbours.item()) < 0.01


def test_training_without_the_step_context_is_an_error():
    layer = IndexedDropout(0.1).train()
    with pytest.raises(RuntimeError, match="dropout_step"):
        layer(torch.ones(2, 3))
    assert torch.equal(layer.eval()(torch.ones(2, 3)), torch.ones(2, 3))
