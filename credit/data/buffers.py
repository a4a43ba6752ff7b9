"""Sample buffers, reused once nothing holds them.

A 0.25-degree sample is ~0.45 GiB, and fresh memory costs more than filling it: a fresh
private buffer faults in every 4 KiB page on first touch, and a fresh shared-memory buffer
(what a DataLoader worker sends to the training process) costs an allocation, every page's
fault and an unmap besides, about four times the reads that fill it (benchmarks/data.py).
So each process keeps the buffers it allocated (up to ``POOL_SIZE`` per size) and hands one
out again once nothing references it; a pool grows only when none is free, so it holds what
the loader's busiest moment needed:

- in the process that builds and uses the sample (no DataLoader workers): private memory
  allocated through numpy, which asks the kernel for huge pages; a buffer is free when
  torch's use count of its storage says only the pool holds it.
- in a DataLoader worker: shared memory, which the training process maps when it receives a
  batch. A worker cannot see the training process's references, so each buffer ends in a
  trailer (a marker, its state and how often it was handed out). :func:`recycled` wraps the
  training process's batch iterator and marks a received buffer released once that process
  has dropped every reference to it; a worker reuses a buffer only when it is marked
  released *and* the worker itself holds no other reference. Without :func:`recycled`
  nothing marks a buffer released and nothing is reused.

Hand-written: torch's DataLoader allocates each batch afresh and has no pool.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import TypeVar

import numpy as np
import torch

__all__ = ["POOL_SIZE", "hand_outs", "recycled", "release", "sample_buffer"]

POOL_SIZE = 12
"""Most buffers kept per size and process. A worker at torch's default prefetch factor (2)
needs about 4 samples' buffers at once (2 prefetched, 1 being trained on, 1 being filled),
and a sample may take 2 or 3 of one size (state and target)."""

_MARKER = 0x6372656469744246  # b"creditBF": identifies a pooled shared buffer
_HANDED_OUT, _RELEASED = 1, 2
_TRAILER = 3  # int64 words: marker, state, times handed out
_PAGE = 4096

T = TypeVar("T")


def _use_count(storage: torch.UntypedStorage) -> int:
    return torch._C._storage_Use_Count(storage._cdata)


def _trailer(storage: torch.UntypedStorage) -> torch.Tensor | None:
    """The trailer words of a pooled shared buffer, or None for any other storage."""
    nbytes = storage.nbytes()
    if not storage.is_shared() or nbytes < 8 * _TRAILER or nbytes % 8:
        return None
    words = torch.empty(0, dtype=torch.int64).set_(storage, nbytes // 8 - _TRAILER, (_TRAILER,))
    return words if int(words[0]) == _MARKER else None


class _Pool:
    """This process's buffers by (kind, size): (storage, its trailer view or None)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.entries: dict[tuple[str, int], list[tuple[torch.UntypedStorage, torch.Tensor | None]]] = {}

    def take(self, nbytes: int, shared: bool) -> tuple[torch.UntypedStorage, torch.Tensor | None]:
        key = ("shared" if shared else "private", nbytes)
        entries = self.entries.setdefault(key, [])
        for storage, trailer in entries:
            held_by_pool = 1 if trailer is None else 2  # the entry's storage (and trailer view)
            if _use_count(storage) != held_by_pool:
                continue
            if trailer is not None and int(trailer[1]) != _RELEASED:
                continue
            return storage, trailer
        entry = _allocate(nbytes, shared)
        if len(entries) < POOL_SIZE:
            entries.append(entry)
        return entry


def _allocate(nbytes: int, shared: bool) -> tuple[torch.UntypedStorage, torch.Tensor | None]:
    if not shared:  # numpy's allocator advises huge pages: ~3x cheaper first touch than torch's
        # Page-aligned like shared memory (numpy aligns to 16 bytes, torch to 64): a kernel that
        # splits its work at alignment boundaries then splits every sample buffer alike.
        raw = np.empty(nbytes + _PAGE, np.uint8)
        start = -raw.ctypes.data % _PAGE
        return torch.from_numpy(raw[start:start + nbytes]).untyped_storage(), None
    padded = -(-nbytes // 8) * 8
    storage = torch.UntypedStorage._new_shared(padded + 8 * _TRAILER)
    trailer = torch.empty(0, dtype=torch.int64).set_(storage, padded // 8, (_TRAILER,))
    trailer.copy_(torch.tensor([_MARKER, _HANDED_OUT, 0]))
    return storage, trailer


_pool: _Pool | None = None


def _this_process_pool() -> _Pool:
    global _pool
    if _pool is None or _pool.pid != os.getpid():  # a forked child never uses its parent's
        _pool = _Pool()
    return _pool


def sample_buffer(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialized float32 tensor of ``shape`` for one sample, from this process's pool.

    In a DataLoader worker it lives in shared memory from the start, so handing it to the
    training process moves no bytes (a private tensor would be copied into shared memory
    there, as torch's default collate does)."""
    nbytes = int(np.prod(shape)) * 4
    shared = torch.utils.data.get_worker_info() is not None
    storage, trailer = _this_process_pool().take(nbytes, shared)
    if trailer is not None:
        trailer[1] = _HANDED_OUT
        trailer[2] += 1
    return torch.empty(0, dtype=torch.float32).set_(storage, 0, shape)


def _shared_storages(batch: object) -> list[torch.UntypedStorage]:
    """The pooled shared buffers behind the tensors of ``batch`` (a tensor, or a dict, list or
    tuple of them, nested)."""
    if isinstance(batch, torch.Tensor):
        storage = batch.untyped_storage()
        return [storage] if _trailer(storage) is not None else []
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    return [s for value in values for s in _shared_storages(value)]


def _mark_released(storage: torch.UntypedStorage) -> None:
    trailer = _trailer(storage)
    if trailer is not None:
        trailer[1] = _RELEASED


def release(batch: object) -> None:
    """Mark the pooled buffers behind ``batch`` released: this process will not read them again
    and has sent them nowhere (e.g. samples just copied into a stacked batch). A worker still
    reuses one only after its own references are gone."""
    for storage in _shared_storages(batch):
        _mark_released(storage)


def hand_outs(tensor: torch.Tensor) -> int | None:
    """How many times the pooled shared buffer behind ``tensor`` was handed out (1: never
    reused), or None if it is not one."""
    trailer = _trailer(tensor.untyped_storage())
    return None if trailer is None else int(trailer[2])


_received: list[torch.UntypedStorage] = []  # pooled buffers this process received, not yet released


def _release_dropped() -> None:
    """Mark released every received buffer that nothing but `_received` refers to any more."""
    still = []
    for storage in _received:
        if _use_count(storage) == 1:
            _mark_released(storage)
        else:
            still.append(storage)
    _received[:] = still


def recycled(batches: Iterable[T]) -> Iterator[T]:
    """Iterate ``batches`` (a DataLoader), marking each received pooled buffer released once
    nothing in this process refers to it any more, so that the worker that filled it can reuse
    it. A caller may keep a batch as long as it likes: its buffers are then not reused. Buffers
    still held when the iteration ends (the last batch) are released by a later iteration.

    ``iter(batches)`` is called here, not at the first batch: a DataLoader's iterator draws
    its base seed from the global RNG, which must not happen inside a seeded training step."""
    return _releasing(iter(batches))


def _releasing(iterator: Iterator[T]) -> Iterator[T]:
    try:
        while True:
            _release_dropped()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            known = {s.data_ptr() for s in _received}
            for storage in _shared_storages(batch):  # once each: every wrapper adds a use
                if storage.data_ptr() not in known:
                    known.add(storage.data_ptr())
                    _received.append(storage)
            yield batch
            del batch
    finally:
        _release_dropped()
