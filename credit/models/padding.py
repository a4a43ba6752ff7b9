"""Padding of lat-lon fields, for both model families: the windowformer's `EarthPad` (to a
multiple of its windows) and CREDIT's `padding_conf` (`BoundaryPadding`).

Earth-aware padding: longitude wraps around, latitude reflects across the poles.

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


# ---- CREDIT's `padding_conf` ------------------------------------------------------------
# CREDIT's boundary padding (`padding_conf`) of a (..., H, W) lat-lon field.
#
# `earth`: the rows padded beyond each pole are the edge rows of the field rolled by half
# the longitudes and mirrored (the neighbour across a pole is half a turn away), then
# longitude wraps around. `mirror`: longitude wraps, latitude reflects. CREDIT's own order
# of operations (poles first, on the unpadded width) is kept, because trained weights saw
# exactly these values.

BOUNDARY_MODES = ("earth", "mirror")


class BoundaryPadding:
    """Pads and unpads by `pad_lat` = [north, south] rows and `pad_lon` = [west, east]
    columns. Holds no parameters."""

    def __init__(self, mode: str, pad_lat: tuple[int, int], pad_lon: tuple[int, int]) -> None:
        if mode not in BOUNDARY_MODES:
            raise ValueError(f"model.padding_conf.mode={mode!r} is not one of {list(BOUNDARY_MODES)}")
        for key, pads in (("pad_lat", pad_lat), ("pad_lon", pad_lon)):
            if len(pads) != 2 or any(int(p) < 0 for p in pads):
                raise ValueError(f"model.padding_conf.{key}={list(pads)} must be two sizes >= 0")
        self.mode = mode
        self.pad_lat = (int(pad_lat[0]), int(pad_lat[1]))
        self.pad_lon = (int(pad_lon[0]), int(pad_lon[1]))

    def padded(self, grid: tuple[int, int]) -> tuple[int, int]:
        return grid[0] + sum(self.pad_lat), grid[1] + sum(self.pad_lon)

    def check(self, grid: tuple[int, int]) -> None:
        if max(self.pad_lat) > grid[0] or (self.mode == "mirror" and max(self.pad_lat) >= grid[0]):
            raise ValueError(
                f"model.padding_conf.pad_lat={list(self.pad_lat)} is larger than the grid's "
                f"{grid[0]} latitudes"
            )
        if max(self.pad_lon) > grid[1]:
            raise ValueError(
                f"model.padding_conf.pad_lon={list(self.pad_lon)} is larger than the grid's "
                f"{grid[1]} longitudes"
            )

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        north, south = self.pad_lat
        west, east = self.pad_lon
        if self.mode == "earth":
            if north or south:
                rolled = torch.roll(x, shifts=x.shape[-1] // 2, dims=-1)
                x = torch.cat([rolled[..., :north, :].flip(-2), x,
                               rolled[..., x.shape[-2] - south:, :].flip(-2)], dim=-2)
            if west or east:
                x = _circular(x, west, east)
            return x
        if west or east:
            x = _circular(x, west, east)
        if north or south:
            x = _along_last_two(x, lambda t: F.pad(t, (0, 0, north, south), mode="reflect"))
        return x

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        north, south = self.pad_lat
        west, east = self.pad_lon
        return x[..., north: x.shape[-2] - south, west: x.shape[-1] - east]


def _along_last_two(x: torch.Tensor, op) -> torch.Tensor:
    """Apply a 2-D padding op to (..., H, W) of any rank (torch's non-constant modes take
    3-D or 4-D input)."""
    lead = x.shape[:-2]
    y = op(x.reshape(-1, 1, *x.shape[-2:]))
    return y.reshape(*lead, *y.shape[-2:])


def _circular(x: torch.Tensor, west: int, east: int) -> torch.Tensor:
    return torch.cat([x[..., x.shape[-1] - west:], x, x[..., :east]], dim=-1)
