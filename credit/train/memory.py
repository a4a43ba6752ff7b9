"""Peak memory of each training row: the most this rank held since the previous row, the
largest over all ranks in `metrics.csv` and the progress line.

CUDA: torch's allocator's peak allocated and reserved bytes, reset after every reading. CPU:
the process's peak resident set size, `VmHWM` of /proc/self/status, reset by writing 5 to
/proc/self/clear_refs (Linux): that is the only per-interval peak of a whole process the
kernel keeps, which is why this is read by hand. Where the reset is refused (other kernels),
the reading is the peak since the process started and `resets` is False.
"""

from __future__ import annotations

import resource
from pathlib import Path

import torch
import torch.distributed as dist

_STATUS, _CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def _resident_peak() -> int:
    """Peak resident bytes since the last reset (or since the process started)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_resident_peak() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


class PeakMemory:
    """`read()`: (peak, reserved) bytes of this rank since the previous `read()` (reserved:
    CUDA only, else None); `read_max(group)`: the same, the largest over the ranks of `group`."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.resets = True if self.cuda else _reset_resident_peak()

    def read(self) -> tuple[int, int | None]:
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device)
            reserved = torch.cuda.max_memory_reserved(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return peak, reserved
        peak = _resident_peak()
        if self.resets:
            _reset_resident_peak()
        return peak, None

    def read_max(self, group: dist.ProcessGroup | None = None) -> tuple[int, int | None]:
        peak, reserved = self.read()
        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size(group) == 1:
            return peak, reserved
        both = torch.tensor([peak, reserved or 0], dtype=torch.int64, device=self.device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
        return int(both[0]), (int(both[1]) if self.cuda else None)


def mib(value: int | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)
