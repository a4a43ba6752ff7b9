"""Pooled sample buffers: reused once nothing holds them, never while anything does."""

from __future__ import annotations

import torch
from datahelpers import SPEC, files_for

from credit.data import ERA5Dataset, collate_samples, recycled
from credit.data.buffers import hand_outs

KEYS = ("state", "forcing", "static", "target")


def _make(root):
    return ERA5Dataset(root, files=files_for(root), variables=SPEC, levels=(500, 850),
                       period=("2000-01-01", "2000-01-02"), history_len=2, forecast_len=1)


def _reference(ds):
    return [{key: ds[i][key].clone() for key in KEYS} for i in range(len(ds))]


def _loader(ds, order, batch_size=1):
    return torch.utils.data.DataLoader(ds, sampler=order, batch_size=batch_size, num_workers=2,
                                       collate_fn=collate_samples, multiprocessing_context="fork")


def test_private_buffers_are_reused_only_once_dropped(small_root):
    ds = _make(small_root)
    reference = _reference(ds)
    kept = ds[0]
    dropped = ds[1]
    pointer = dropped["state"].data_ptr()
    assert pointer != kept["state"].data_ptr()
    del dropped
    again = ds[2]
    assert again["state"].data_ptr() == pointer  # reused: nothing held it any more
    view = again["target"][0, 1]  # a view keeps the whole buffer
    del again
    fresh = ds[3]
    assert fresh["target"].untyped_storage().data_ptr() != view.untyped_storage().data_ptr()
    for i in range(4, len(ds)):
        ds[i]
    for key in KEYS:
        assert torch.equal(kept[key], reference[0][key]), key
    assert torch.equal(view, reference[2]["target"][0, 1])
    for key in KEYS:
        assert torch.equal(fresh[key], reference[3][key]), key


def test_workers_reuse_buffers_the_training_process_released(small_root):
    """Batches kept by the training process are never overwritten; the others' buffers are
    reused by the workers once `recycled` saw them dropped."""
    ds = _make(small_root)
    reference = _reference(ds)
    order = list(range(len(ds))) * 4
    kept, uses = [], []
    for n, batch in enumerate(recycled(_loader(ds, order))):
        uses.append(hand_outs(batch["state"]))
        if n % 5 == 0:
            kept.append((order[n], batch))
        for key in KEYS:  # what arrives is the sample asked for
            assert torch.equal(batch[key][0], reference[order[n]][key]), (n, key)
    assert max(uses) > 2, uses  # buffers went round more than once
    for index, batch in kept:  # ... and none that was kept was refilled
        for key in KEYS:
            assert torch.equal(batch[key][0], reference[index][key]), (index, key)


def test_without_recycled_nothing_is_reused(small_root):
    ds = _make(small_root)
    uses = [hand_outs(batch["state"]) for batch in _loader(ds, list(range(len(ds))) * 3)]
    assert uses == [1] * len(uses)


def test_stacked_batches_from_workers(small_root):
    """Samples copied into a stacked batch release their buffers inside the worker."""
    ds = _make(small_root)
    reference = _reference(ds)
    order = list(range(len(ds))) * 3
    batches = list(recycled(_loader(ds, order, batch_size=3)))
    for b, batch in enumerate(batches):
        assert hand_outs(batch["state"]) is None  # a stack made by torch's collate
        for j in range(3):
            for key in KEYS:
                assert torch.equal(batch[key][j], reference[order[3 * b + j]][key]), (b, j, key)


def test_buffers_of_samples_that_failed_are_reused(small_root, tmp_path):
    """Samples refused as non-finite (data.nonfinite=skip_sample) give their buffers back at
    once: a worker's pool does not fill up with buffers nobody will release."""
    import shutil

    import numpy as np
    import xarray as xr

    root = tmp_path / "poisoned"
    shutil.copytree(small_root, root)
    with xr.open_dataset(root / "era5_2000.nc") as ds:
        edited = ds.load()
    edited["T"][:4] = np.nan  # samples 0-3 read a NaN; 4 and 5 do not
    edited.to_netcdf(root / "era5_2000.nc")
    ds = ERA5Dataset(root, files=files_for(root), variables=SPEC, levels=(500, 850),
                     period=("2000-01-01", "2000-01-02"), history_len=2, forecast_len=1, nonfinite="skip_sample")
    order = list(range(len(ds))) * 6  # each of 0-3 fails up to 4 times: many more buffers than a pool holds
    uses = [hand_outs(batch["state"]) for batch in recycled(_loader(ds, order))]
    assert all(u > 1 for u in uses[-6:]), uses  # still reused at the end
