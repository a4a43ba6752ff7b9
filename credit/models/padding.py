"""Earth-aware padding: longitude wraps around, latitude reflects across the poles.

A lat-lon grid is periodic in longitude, so the columns padded on the west come from the
east edge and vice versa. Across a pole the neighbour of a point is the point on the
same meridian half a turn away, so the rows padded above the north pole are the first
rows mirrored and rolled by half the longitudes (and likewise at the south pole).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def required_multiple(strides: list[int], windows_per_stage: list[list[int]]) -> int:
    """Smallest size the padded grid must divide by so every stage's windows tile it.

    Stage i sees the grid divided by prod(strides[:i+1]); its windows (local and
    global) must divide that stage's size.
    """
    multiple = 1
    scale = 1
    for stride, windows in zip(strides, windows_per_stage):
        scale *= stride
        stage_multiple = scale * math.lcm(*windows)
        multiple = math.lcm(multiple, stage_multiple)
    return multiple


def padding_for(size: int, multiple: int) -> tuple[int, int]:
    """(before, after) padding that brings `size` up to a multiple of `multiple`."""
    total = (-size) % multiple
    return total // 2, total - total // 2


class EarthPad(nn.Module):
    """Pad a (B, C, H, W) lat-lon field to a size the encoder can tile; `crop` undoes it.

    `mode="earth"` wraps longitude and reflects across the poles (with a half-turn roll
    when the number of longitudes is even); `mode="none"` pads nothing and the grid
    must already divide by `multiple`.
    """

    def __init__(self, grid: tuple[int, int], multiple: int, mode: str = "earth") -> None:
        super().__init__()
        if mode not in ("earth", "none"):
            raise ValueError(f"model.padding={mode!r} is not one of 'earth', 'none'")
        height, width = grid
        self.mode = mode
        self.grid = (height, width)
        if mode == "none":
            for name, size in (("height", height), ("width", width)):
                if size % multiple:
                    raise ValueError(
                        f"grid {name} {size} is not divisible by {multiple} (the product of "
                        f"model.cross_embed_strides times the window sizes); set "
                        f"model.padding=earth to pad the grid"
                    )
            self.pad_lat = (0, 0)
            self.pad_lon = (0, 0)
        else:
            self.pad_lat = padding_for(height, multiple)
            self.pad_lon = padding_for(width, multiple)
            if max(self.pad_lat) > height:
                raise ValueError(
                    f"grid height {height} is too small to pad to a multiple of {multiple}"
                )

    @property
    def padded_grid(self) -> tuple[int, int]:
        return (
            self.grid[0] + sum(self.pad_lat),
            self.grid[1] + sum(self.pad_lon),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        north, south = self.pad_lat
        west, east = self.pad_lon
        if west or east:
            x = F.pad(x, (west, east, 0, 0), mode="circular")
        if north or south:
            width = x.shape[-1]
            shift = width // 2 if width % 2 == 0 else 0
            parts = []
            if north:
                parts.append(torch.roll(x[..., :north, :].flip(-2), shift, dims=-1))
            parts.append(x)
            if south:
                parts.append(torch.roll(x[..., -south:, :].flip(-2), shift, dims=-1))
            x = torch.cat(parts, dim=-2)
        return x

    def crop(self, x: torch.Tensor) -> torch.Tensor:
        north, _ = self.pad_lat
        west, _ = self.pad_lon
        height, width = self.grid
        return x[..., north : north + height, west : west + width]
