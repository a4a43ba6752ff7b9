"""CREDIT's boundary padding (`padding_conf`) of a (..., H, W) lat-lon field.

`earth`: the rows padded beyond each pole are the edge rows of the field rolled by half
the longitudes and mirrored (the neighbour across a pole is half a turn away), then
longitude wraps around. `mirror`: longitude wraps, latitude reflects. CREDIT's own order
of operations (poles first, on the unpadded width) is kept, because trained weights saw
exactly these values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MODES = ("earth", "mirror")


class BoundaryPadding:
    """Pads and unpads by `pad_lat` = [north, south] rows and `pad_lon` = [west, east]
    columns. Holds no parameters."""

    def __init__(self, mode: str, pad_lat: tuple[int, int], pad_lon: tuple[int, int]) -> None:
        if mode not in MODES:
            raise ValueError(f"model.padding_conf.mode={mode!r} is not one of {list(MODES)}")
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
