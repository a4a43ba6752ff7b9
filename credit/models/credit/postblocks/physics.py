"""The grid and column arithmetic of CREDIT's conservation fixers (`credit/physics_core.py`
in CREDIT), operation for operation in float32, so a fixed forecast equals CREDIT's.

`deterministic=True` (the model's `gemm: deterministic`) adds each sample's grid in the
deterministic GEMM's fixed order, whatever the batch, so a fixed forecast has the same bits
in every dp x tp layout; the other reductions run along the levels, one output at a time.

Written out rather than shared with `credit.data.physics`: CREDIT's cell areas come from a
second-order gradient of sin(latitude) and its vertical integrals from its own trapezoid or
mid-point rule, and matching CREDIT's numbers means matching those choices exactly.
"""

from __future__ import annotations

import torch

from credit.kernels.gemm import det_linear

GRAVITY = 9.80665  # m s-2
RAD_EARTH = 6371000  # m (an int in CREDIT)
RHO_WATER = 1000.0  # kg m-3
LH_WATER = 2.501e6  # J kg-1
CP_DRY = 1004.64  # J kg-1 K-1
CP_VAPOR = 1810.0  # J kg-1 K-1


def cell_area(lon2d: torch.Tensor, lat2d: torch.Tensor) -> torch.Tensor:
    """(H, W) cell areas in m² from 2-D longitude and latitude in degrees."""
    d_phi = torch.gradient(torch.sin(torch.deg2rad(lat2d)), dim=0, edge_order=2)[0]
    d_lambda = torch.gradient(torch.deg2rad(lon2d), dim=1, edge_order=2)[0]
    d_lambda = (d_lambda + torch.pi) % (2 * torch.pi) - torch.pi
    return torch.abs(RAD_EARTH**2 * d_phi * d_lambda)


class ColumnPhysics:
    """Cell areas and vertical integrals on pressure levels (`pressure`, Pa, top to bottom)
    or hybrid sigma levels (`coef_a` Pa and `coef_b`: p = a + b·sp). With `midpoint` the
    quantities sit between the levels (sigma: `a`, `b` are the interfaces); otherwise the
    trapezoid rule. Tensors are (B, level, H, W); `sp` is (B, H, W)."""

    def __init__(self, lon2d: torch.Tensor, lat2d: torch.Tensor, *, midpoint: bool,
                 pressure: torch.Tensor | None = None, coef_a: torch.Tensor | None = None,
                 coef_b: torch.Tensor | None = None, deterministic: bool = False) -> None:
        self.area, self.midpoint, self.deterministic = cell_area(lon2d, lat2d), midpoint, deterministic
        self.sigma = pressure is None
        self.pressure, self.coef_a, self.coef_b = pressure, coef_a, coef_b

    def levels(self) -> int:
        if not self.sigma:
            return len(self.pressure)
        return len(self.coef_a) - 1 if self.midpoint else len(self.coef_a)

    def weighted_sum(self, q: torch.Tensor) -> torch.Tensor:
        """Σ q·area over the grid: (B, H, W) -> (B,)."""
        weighted = q * self.area.to(q.device)
        if self.deterministic:
            ones = torch.ones(1, weighted[0].numel(), dtype=weighted.dtype, device=weighted.device)
            return det_linear(weighted.flatten(-2).contiguous(), ones).squeeze(-1)
        return torch.sum(weighted, dim=(-2, -1))

    def _thickness(self, sp: torch.Tensor | None, start: int | None = None, end: int | None = None) -> torch.Tensor:
        if not self.sigma:
            thickness = self.pressure.diff(dim=-1)
            if start is not None:  # the mid-point rule slices thicknesses, the trapezoid levels
                thickness = thickness[start:end] if self.midpoint else self.pressure[start:end].diff(dim=-1)
            return thickness.view(1, -1, 1, 1)
        pressure = self.coef_a.view(1, -1, 1, 1) + self.coef_b.view(1, -1, 1, 1) * sp.unsqueeze(1)
        if start is None:
            return pressure.diff(dim=1)
        if self.midpoint:
            return pressure.diff(dim=1)[:, start:end]
        return pressure[:, start:end].diff(dim=1)

    def integral(self, q: torch.Tensor, sp: torch.Tensor | None = None) -> torch.Tensor:
        """∫ q dp over every level: (B, level, H, W) -> (B, H, W)."""
        delta_p = self._thickness(sp)
        if self.midpoint:
            return torch.sum(q * delta_p, dim=1)
        return torch.sum(0.5 * (q[:, :-1] + q[:, 1:]) * delta_p, dim=1)

    def integral_sliced(self, q: torch.Tensor, start: int, end: int, sp: torch.Tensor | None = None) -> torch.Tensor:
        """∫ q dp over levels start .. end-1 (pressure levels only, as CREDIT's mass fixer)."""
        delta_p = self._thickness(sp, start, end)
        q = q[:, start:end]
        if self.midpoint:
            return torch.sum(q * delta_p, dim=1)
        return torch.sum(0.5 * (q[:, :-1] + q[:, 1:]) * delta_p, dim=1)

    def total_dry_air_mass(self, q: torch.Tensor, sp: torch.Tensor | None = None) -> torch.Tensor:
        return self.weighted_sum(self.integral(1 - q, sp) / GRAVITY)

    def total_column_water(self, q: torch.Tensor, sp: torch.Tensor | None = None) -> torch.Tensor:
        return self.integral(q, sp) / GRAVITY
