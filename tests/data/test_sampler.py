"""DPShardedBatchSampler: sharding over data-parallel ranks, determinism and resumption."""

from __future__ import annotations

import itertools

import pytest
import torch

from credit.data import DPShardedBatchSampler


def _sampler(rank, size=3, n=50, bs=4, seed=7, **kw):
    return DPShardedBatchSampler(n, bs, dp_rank=rank, dp_size=size, seed=seed, **kw)


def test_ranks_take_disjoint_contiguous_slices_of_each_global_batch():
    per_rank = [list(_sampler(r)) for r in range(3)]
    order = torch.randperm(50, generator=torch.Generator().manual_seed(7)).tolist()
    assert all(len(b) == 4 for batches in per_rank for b in batches)
    assert _sampler(0).batches_per_epoch == 4 == len(per_rank[0])  # 50 // 12, last partial dropped
    for b in range(4):
        union = [i for r in range(3) for i in per_rank[r][b]]
        assert union == order[12 * b:12 * (b + 1)]  # rank order concatenates to the global batch
        assert len(set(union)) == 12
    seen = [i for batches in per_rank for b in batches for i in b]
    assert len(seen) == len(set(seen)) == 48


def test_same_dp_rank_gets_identical_batches():
    # Tensor-parallel peers share dp_rank; they must see exactly the same samples.
    assert list(_sampler(1)) == list(_sampler(1))
    assert list(_sampler(1)) != list(_sampler(2))


def test_epochs_reshuffle_and_position_advances():
    s = _sampler(0)
    first = list(s)
    assert s.state_dict() == {"epoch": 1, "batch_in_epoch": 0}
    second = list(s)
    assert first != second and sorted(map(sorted, first)) != sorted(map(sorted, second))
    plain = _sampler(0, shuffle=False)
    assert list(plain)[0] == [0, 1, 2, 3]


def test_resume_from_position_reproduces_sequence():
    reference = list(itertools.islice(_sampler(2).iterate_forever(), 10))  # spans epochs 0..2
    assert [(e, b) for e, b, _ in reference[:6]] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]
    s = _sampler(2)
    it = s.iterate_forever()
    for _ in range(5):
        next(it)
    state = s.state_dict()
    assert state == {"epoch": 1, "batch_in_epoch": 1}
    resumed = _sampler(2)
    resumed.load_state_dict(state)
    assert list(itertools.islice(resumed.iterate_forever(), 5)) == reference[5:]
    again = _sampler(2)
    again.set_position(1, 2)
    assert list(again) == [b for e, i, b in reference if e == 1 and i >= 2]


def test_no_drop_last_deals_the_remainder():
    batches = [list(_sampler(r, size=2, n=10, bs=3, drop_last=False)) for r in range(2)]
    flat = sorted(i for rank in batches for b in rank for i in b)
    assert flat == list(range(10))  # 10 = 6 + 4: rank 0 gets 3, rank 1 gets 1 in the last step
    assert [len(b) for b in batches[1]] == [3, 1]


def test_invalid_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        DPShardedBatchSampler(10, 0, dp_rank=0, dp_size=1, seed=0)
    with pytest.raises(ValueError, match="dp_rank < dp_size"):
        DPShardedBatchSampler(10, 2, dp_rank=2, dp_size=2, seed=0)
    with pytest.raises(ValueError, match=r"too few for one global batch of batch_size \* dp_size = 4 \* 3 = 12"):
        DPShardedBatchSampler(11, 4, dp_rank=0, dp_size=3, seed=0)
    with pytest.raises(ValueError, match="position"):
        _sampler(0).set_position(0, 99)


def test_collate_samples_matches_default_collate_and_views_a_single_sample():
    from credit.data import collate_samples

    samples = [{"state": torch.randn(2, 3, 4, 5), "time": torch.arange(3), "index": torch.tensor(i)}
               for i in range(3)]
    for batch in (samples, samples[:1]):
        ours, ref = collate_samples(batch), torch.utils.data.default_collate(batch)
        assert ours.keys() == ref.keys()
        for key in ref:
            assert ours[key].shape == ref[key].shape and torch.equal(ours[key], ref[key])
    single = collate_samples(samples[:1])
    assert single["state"].data_ptr() == samples[0]["state"].data_ptr()  # no 0.5 GB copy
