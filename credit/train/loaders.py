"""The training and validation DataLoaders of a run."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset

from credit.data import DPShardedBatchSampler, collate_samples, evenly_spaced


class _Batches:
    """Endless batch-index stream for a DataLoader, starting at the sampler's position."""

    def __init__(self, sampler: DPShardedBatchSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[int]]:
        for _, _, indices in self.sampler.iterate_forever():
            yield indices


def build_loaders(train_set: Dataset, valid_set: Dataset, sampler: DPShardedBatchSampler, data: DictConfig,
                  batch_size: int) -> tuple[DataLoader, DataLoader]:
    """The endless training loader over `sampler`'s batches from its current position
    (`data.num_workers` processes, kept between epochs), and the validation loader over
    `data.valid_samples` evenly spaced samples, in this process."""
    loader = DataLoader(
        train_set,
        batch_sampler=_Batches(sampler),
        num_workers=data.num_workers,
        persistent_workers=data.num_workers > 0,
        collate_fn=collate_samples,
    )
    valid_indices = evenly_spaced(data.valid_samples, len(valid_set))
    valid_loader = DataLoader(
        torch.utils.data.Subset(valid_set, valid_indices),
        batch_size=batch_size,
        shuffle=False,
        num_workers=0,
        collate_fn=collate_samples,
    )
    return loader, valid_loader
