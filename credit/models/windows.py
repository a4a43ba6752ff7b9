"""What every windowed-attention transformer shares: the window partitions of a
channels-last (B, H, W, C) grid, the head-split check of its tensor-parallel plan, and the
residual rounds of a stage.

`dilated=False`: contiguous size×size patches; `dilated=True`: the size×size points that lie
H/size (and W/size) apart. Windows come out sample-major, as (B · windows, size², C).
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh

from credit.config.validate_model import heads_split_error
from credit.parallel.sequence import gather_rows, own_rows


def to_windows(x: torch.Tensor, size: int, dilated: bool) -> torch.Tensor:
    b, h, w, c = x.shape
    if dilated:
        x = x.view(b, size, h // size, size, w // size, c).permute(0, 2, 4, 1, 3, 5)
    else:
        x = x.view(b, h // size, size, w // size, size, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, size * size, c)


def from_windows(x: torch.Tensor, shape: tuple[int, ...], size: int, dilated: bool) -> torch.Tensor:
    """The inverse of `to_windows` for a grid of `shape` (B, H, W, C)."""
    b, h, w, c = shape
    x = x.view(b, h // size, w // size, size, size, c)
    x = x.permute(0, 3, 1, 4, 2, 5) if dilated else x.permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, w, c)


def check_head_split(heads: int, dim_head: int, tp_size: int) -> None:
    """ValueError unless `heads` attention heads split whole over `tp_size` ranks."""
    problem = heads_split_error(heads, tp_size)
    if problem:
        raise ValueError(f"attention with {heads} heads (width {heads * dim_head} / model.dim_head={dim_head}) "
                         f"cannot be split over trainer.parallelism.tensor={tp_size}: {problem}")


def residual_rounds(x: torch.Tensor, rounds, sequence_mesh: DeviceMesh | None = None,
                    rows_through: bool = False) -> torch.Tensor:
    """x (B, C, H, W) through every layer of every round, each residual, channels-last inside.

    `sequence_mesh`: the residual stream inside holds this rank's rows only (sequence
    parallelism), gathered whole again on the way out unless `rows_through` (x comes in as
    this rank's rows and leaves as them)."""
    x = x.permute(0, 2, 3, 1)  # channels-last for the Linear projections
    split = sequence_mesh is not None and not rows_through
    if split:
        x = own_rows(x, sequence_mesh)
    for block in rounds:
        for layer in block:
            x = x + layer(x)
    if split:
        x = gather_rows(x, sequence_mesh)
    # a fresh tensor, not a view (the permute back is often already contiguous): an in-place op
    # on a wrapped block's output view would bypass FSDP2's pre-backward hook
    return x.permute(0, 3, 1, 2).clone(memory_format=torch.contiguous_format)
