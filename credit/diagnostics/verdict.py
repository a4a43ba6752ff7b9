"""Which ranks disagree: the modal value among the ranks that must agree is the reference.

Rank 0 is not trusted more than any other rank: if it alone holds a different checksum, it
is the one reported. When no value holds a strict majority (two ranks, two values), the
record names every candidate and no expected value, since nothing here can tell which one
is right.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field


@dataclass
class Mismatch:
    """One rank's disagreement on one tensor, as written to `sdc.jsonl`."""

    step: int
    rank: int
    layer: str  # module path (a Linear, or an FSDP2 unit)
    path: str  # comm | compute | state (replicas diverged after the optimizer step)
    check: str  # all_gather | reduce_scatter | replica | compute
    tensor: str  # parameter (or output) the checksums cover
    expected: int | None  # the modal checksum, or the independent recomputation's
    got: int
    peers: list[int] = field(default_factory=list)  # ranks compared
    candidates: dict[str, list[int]] | None = None  # no majority: value -> ranks
    detail: str = ""

    def record(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}


def layer_of(param_name: str) -> str:
    """The module path a parameter belongs to ("<root>" for the model's own)."""
    return param_name.rsplit(".", 1)[0] if "." in param_name else "<root>"


def disagreeing(values: dict[int, int]) -> tuple[int | None, list[int], dict[str, list[int]] | None]:
    """`values`: rank -> checksum. Returns (reference, ranks that differ from it, None), or
    with no strict majority (None, every rank, {value: ranks})."""
    counts = Counter(values.values())
    if len(counts) == 1:
        return next(iter(counts)), [], None
    (top, top_count), (_, second_count) = counts.most_common(2)
    if top_count > second_count:
        return top, sorted(r for r, v in values.items() if v != top), None
    candidates: dict[str, list[int]] = {}
    for rank, value in sorted(values.items()):
        candidates.setdefault(str(value), []).append(rank)
    return None, sorted(values), candidates
