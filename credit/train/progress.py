"""Progress of a training job on the terminal, or in a batch job's log file.

On a terminal, a tqdm bar. When stderr is not a terminal (PBS and SLURM write it to a file),
a tqdm bar would write a carriage-return redraw per update into the log, so one plain line
is printed every `every` steps instead: step, loss, samples/s, the peak memory of the most
loaded rank and the estimated time left.
"""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

log = logging.getLogger(__name__)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


class TrainingProgress:
    """Report steps `initial + 1 .. total`; `enabled=False` reports nothing (other ranks)."""

    def __init__(self, total: int, initial: int, enabled: bool, every: int,
                 terminal: bool | None = None) -> None:
        self.total, self.every, self.enabled = total, every, enabled
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        self._first_step, self._started = initial, time.perf_counter()
        self._bar = None
        if enabled and self.terminal:
            self._bar = tqdm(total=total, initial=initial, desc="train", mininterval=1.0)

    def update(self, step: int, loss: float, samples_per_s: float, peak_mib: float | None = None) -> None:
        """`peak_mib`: the largest rank's peak memory since the previous step (metrics.csv's
        peak_mem_mib)."""
        peak = "" if peak_mib is None else f"  peak {peak_mib:.0f} MiB"
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix_str(f"loss={loss:.4f}{peak}", refresh=False)
        elif self.enabled and (step % self.every == 0 or step == self.total):
            done = step - self._first_step
            elapsed = time.perf_counter() - self._started
            left = elapsed / done * (self.total - step) if done else 0.0
            log.info("step %d/%d  loss %.5g  %.1f samples/s%s  ETA %s",
                     step, self.total, loss, samples_per_s, peak, _duration(left))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
