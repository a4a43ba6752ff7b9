"""Peak memory per training row: the peak since the previous row (not since the process
started), the largest over the ranks, in metrics.csv and on the plain progress line."""

import logging

import torch
from parallel.launcher import run_ranks

from credit.train.memory import PeakMemory
from credit.train.progress import TrainingProgress

MIB = 2**20


def _touch(mib: int) -> None:
    block = torch.ones(mib * MIB // 4)  # written, so every page is resident
    assert float(block[-1]) == 1.0
    del block


def test_a_cpu_reading_is_the_peak_since_the_previous_one():
    memory = PeakMemory(torch.device("cpu"))
    assert memory.resets  # Linux: /proc/self/clear_refs resets the peak resident set
    _touch(300)
    with_block, reserved = memory.read()
    without_block, _ = memory.read()  # the block was freed before this interval began
    assert reserved is None
    assert with_block - without_block > 250 * MIB, (with_block / MIB, without_block / MIB)


def _ranks_peak():
    import torch.distributed as dist

    memory = PeakMemory(torch.device("cpu"))
    own, _ = memory.read()
    if dist.get_rank() == 1:
        _touch(300)
    largest, _ = memory.read_max()
    return own, largest


def test_read_max_gives_every_rank_the_most_loaded_ranks_peak():
    (own0, max0), (own1, max1) = run_ranks(_ranks_peak, 2)
    assert max0 == max1
    assert max0 > own1 + 250 * MIB and max0 > own0 + 150 * MIB  # rank 0 alone did not grow


def test_the_plain_progress_line_shows_the_peak(caplog):
    progress = TrainingProgress(total=4, initial=0, enabled=True, every=2, terminal=False)
    with caplog.at_level(logging.INFO, logger="credit.train.progress"):
        progress.update(2, 0.5, 10.0, 1234.4)
    assert "peak 1234 MiB" in caplog.text
