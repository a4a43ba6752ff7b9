"""Resumable batch sampler that shards each global batch over data-parallel ranks only, and
the collation of samples into batches."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from .buffers import release


class DPShardedBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Yield this data-parallel rank's batches of sample indices.

    Each epoch draws a global order (a permutation from ``torch.Generator().manual_seed(seed + epoch)``,
    or ``range(num_samples)`` without shuffling), cuts it into global batches of
    ``batch_size * dp_size`` and gives rank ``r`` the slice ``[r * batch_size, (r + 1) * batch_size)``
    of each. Tensor-parallel peers pass the same ``dp_rank`` and therefore get identical batches.
    With ``drop_last`` an incomplete final global batch is dropped; without it, the remainder is
    dealt out in rank order (some ranks may get a short or no final batch).

    Resuming: :meth:`set_position` (or :meth:`load_state_dict`) makes the next ``__iter__`` start at
    that epoch and batch; after a full pass the position moves to the next epoch.
    """

    def __init__(self, num_samples: int, batch_size: int, *, dp_rank: int, dp_size: int, seed: int,
                 shuffle: bool = True, drop_last: bool = True):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ValueError(f"need 0 <= dp_rank < dp_size, got dp_rank={dp_rank}, dp_size={dp_size}")
        if num_samples < batch_size * dp_size and (drop_last or num_samples < dp_size):
            raise ValueError(f"{num_samples} samples are too few for one global batch of "
                             f"batch_size * dp_size = {batch_size} * {dp_size} = {batch_size * dp_size}")
        self.num_samples, self.batch_size = int(num_samples), int(batch_size)
        self.dp_rank, self.dp_size, self.seed = int(dp_rank), int(dp_size), int(seed)
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.epoch, self.batch_in_epoch = 0, 0

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.dp_size

    @property
    def batches_per_epoch(self) -> int:
        """Number of global batches per epoch (every rank steps this many times, or fewer at a ragged end)."""
        full, rest = divmod(self.num_samples, self.global_batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def __len__(self) -> int:
        return self.batches_per_epoch

    def epoch_order(self, epoch: int) -> list[int]:
        """The global sample order of ``epoch`` (identical on every rank)."""
        if not self.shuffle:
            return list(range(self.num_samples))
        gen = torch.Generator().manual_seed(self.seed + int(epoch))
        return torch.randperm(self.num_samples, generator=gen).tolist()

    def _batch(self, order: list[int], b: int) -> list[int]:
        start = b * self.global_batch_size + self.dp_rank * self.batch_size
        return order[start:start + self.batch_size]

    def set_position(self, epoch: int, batch_in_epoch: int) -> None:
        """Make the next iteration start at global batch ``batch_in_epoch`` of ``epoch``."""
        if epoch < 0 or not 0 <= batch_in_epoch <= self.batches_per_epoch:
            raise ValueError(f"position (epoch={epoch}, batch_in_epoch={batch_in_epoch}) is invalid; "
                             f"need epoch >= 0 and 0 <= batch_in_epoch <= {self.batches_per_epoch}")
        self.epoch, self.batch_in_epoch = int(epoch), int(batch_in_epoch)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.set_position(state["epoch"], state["batch_in_epoch"])

    def __iter__(self) -> Iterator[list[int]]:
        """One epoch from the current position; the position advances as batches are taken."""
        epoch, order = self.epoch, self.epoch_order(self.epoch)
        while self.epoch == epoch and self.batch_in_epoch < self.batches_per_epoch:
            batch = self._batch(order, self.batch_in_epoch)
            self.batch_in_epoch += 1
            if batch:
                yield batch
        if self.epoch == epoch and self.batch_in_epoch >= self.batches_per_epoch:
            self.epoch, self.batch_in_epoch = epoch + 1, 0

    def iterate_forever(self) -> Iterator[tuple[int, int, list[int]]]:
        """Yield ``(epoch, batch_in_epoch, indices)`` endlessly from the current position.

        The position is advanced past each batch before it is yielded, so ``state_dict()`` taken
        after processing a batch resumes at the following one.
        """
        while True:
            epoch, order = self.epoch, self.epoch_order(self.epoch)
            while self.batch_in_epoch < self.batches_per_epoch:
                b = self.batch_in_epoch
                batch = self._batch(order, b)
                self.batch_in_epoch += 1
                if batch:
                    yield epoch, b, batch
            self.epoch, self.batch_in_epoch = epoch + 1, 0


def evenly_spaced(count: int, available: int) -> list[int]:
    """`count` sample indices spread over `available`, always the same ones (validation and
    climatology subsets)."""
    count = min(count, available)
    return sorted({int(i) for i in np.linspace(0, available - 1, count)})


def collate_samples(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack samples into a batch; a batch of one sample is a view of it (no copy: at 0.25
    degrees a sample is ~0.5 GB and a GPU often takes one at a time). In a DataLoader worker
    a view costs no more than a stack either: a tensor not yet in shared memory is moved
    there once when sent, and ERA5Dataset's sample buffers are there from the start. Samples
    stacked into a new batch release their pooled buffers for reuse (see `buffers`)."""
    if len(batch) == 1:
        return {key: value.unsqueeze(0) for key, value in batch[0].items()}
    stacked = torch.utils.data.default_collate(batch)
    release(batch)
    return stacked
