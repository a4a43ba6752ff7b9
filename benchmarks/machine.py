"""The machine a benchmark ran on, printed beside every figure it records."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else what the platform says, with the vector
    instructions torch's kernels use on it (AVX-512 and AVX2 machines give different ratios)."""
    import torch

    name = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} ({torch.backends.cpu.get_cpu_capability()})"
