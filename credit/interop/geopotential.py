"""CREDIT's `geopotential_diagnostic` postblock: the geopotential (m2 s-2) on every hybrid
model level, integrated hydrostatically upward from the surface geopotential through the
virtual temperature of each level, the diagnostic that CREDIT's gen2 BaseLoss scores beside
the outputs (`loss.args.include_computed_diagnostics`).

For a column of L levels ordered top to surface, the interface pressures are
`p = a_half + b_half sp` (L + 1 values, non-positive ones set to 0.57 Pa, the model top), and
with `T_v = T (1 + (R_v / R_d - 1) q)`, `dlogp = log(p_below / p_above)` and
`alpha = 1 - p_above / (p_below - p_above) dlogp`, summed from the surface upward:
`phi_interface = phi_s + cumsum(R_d T_v dlogp)` and `phi_level = phi_interface - R_d T_v alpha`.
The arithmetic is CREDIT's, in its float32 torch operations and order (its postblock maps the
same expressions over columns; here they run on whole (batch, level, lat, lon) tensors), so the
values equal those of CREDIT's postblock (`tests/data/test_credit_geopotential.py`, fixture
made with CREDIT's code by `tests/fixtures/credit_geopotential/make.py`).

The coefficients come from CREDIT's `credit/metadata/ERA5_Lev_Info.nc` (`a_half`, `b_half` on
138 interfaces of ERA5's 137 levels), or from a file in its layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from credit.data.catalog import DataError
from credit.models.deterministic.pointwise import without_remainder

LEVEL_INFO = "ERA5_Lev_Info.nc"
"""The level coefficients CREDIT's postblock reads by default, in its `credit/metadata` folder."""
R_DRY = 287.06
R_VAPOUR = 461.51
MODEL_TOP_PRESSURE = 0.57  # Pa: what an interface pressure at or below 0 becomes


def read_level_info(path: str | Path, a_variable: str = "a_half", b_variable: str = "b_half",
                    levels: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) on the interfaces of the levels, float32, as CREDIT's postblock reads them: every
    interface of the file, or with `levels` (1-based model levels, top to surface) the top
    interface of each and the bottom one of the last."""
    import xarray as xr

    if not Path(path).is_file():
        bare = Path(path).name == str(path)
        raise DataError(f"data.credit.geopotential.level_info_file: {str(path)!r} is not a file"
                        + (f" (a bare name is a file of CREDIT's package, credit/metadata/{path}: run from the "
                           "CREDIT checkout that holds the config, or give its path)" if bare else ""))
    try:
        with xr.open_dataset(path) as ds:
            present = sorted(map(str, ds.variables))
            missing = [name for name in (a_variable, b_variable) if name not in present]
            if not missing:
                a_all, b_all = (torch.Tensor(np.asarray(ds[name].values)) for name in (a_variable, b_variable))
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: not a level coefficient file ({a_variable}, {b_variable} on the interfaces, "
                        f"CREDIT's {LEVEL_INFO}): {err}") from None
    if missing:
        raise DataError(f"{path}: has no variable {missing[0]!r} (it has {present}); the geopotential "
                        f"postblock's model_a_half_var and model_b_half_var name the interface coefficients")
    if a_all.ndim != 1 or a_all.shape != b_all.shape:
        raise DataError(f"{path}: {a_variable} and {b_variable} must be 1-D and of one length "
                        f"(got {tuple(a_all.shape)} and {tuple(b_all.shape)})")
    if levels is None:
        return a_all, b_all
    levels = [int(level) for level in levels]
    if not levels or min(levels) < 1 or max(levels) >= len(a_all):
        raise DataError(f"{path}: levels {levels} must be model levels 1..{len(a_all) - 1} "
                        f"({len(a_all)} interfaces)")
    rows = [level - 1 for level in levels] + [levels[-1]]
    return a_all[rows], b_all[rows]


def geopotential(surface_geopotential: torch.Tensor, surface_pressure: torch.Tensor, temperature: torch.Tensor,
                 specific_humidity: torch.Tensor, a_half: torch.Tensor, b_half: torch.Tensor,
                 flip_vertical: bool = True) -> torch.Tensor:
    """The geopotential on each level, (..., L, H, W), of columns whose levels run along dim -3
    top to surface (`flip_vertical`; otherwise surface to top, as CREDIT takes False): the
    surface geopotential and pressure broadcast as (..., 1, H, W) or (H, W), temperature and
    specific humidity (..., L, H, W), `a_half` and `b_half` (L + 1,)."""
    gamma = R_VAPOUR / R_DRY - 1.0
    shape = (-1, 1, 1)
    pressure = a_half.view(shape) + b_half.view(shape) * surface_pressure
    pressure = torch.where(pressure > 0, pressure, MODEL_TOP_PRESSURE)
    upper, lower = pressure[..., :-1, :, :], pressure[..., 1:, :, :]
    if flip_vertical:
        upper, lower = torch.flip(upper, (-3,)), torch.flip(lower, (-3,))
    # log through torch's vectorised CPU loop only: its scalar tail rounds otherwise, and which
    # elements land there depends on the batch and the grid shard (credit/models/deterministic)
    dlogp = without_remainder(torch.log, (lower / upper).contiguous())
    alpha = 1.0 - ((upper / (lower - upper)) * dlogp)
    virtual = temperature * (1.0 + gamma * specific_humidity)
    if flip_vertical:
        virtual = torch.flip(virtual, (-3,))
    interfaces = surface_geopotential + torch.cumsum(R_DRY * virtual * dlogp, dim=-3)
    levels = interfaces - R_DRY * virtual * alpha
    return torch.flip(levels, (-3,)) if flip_vertical else levels


class ComputedGeopotential:
    """The postblock on the physical output channels: called with (..., C, H, W) channels of
    `channel_variables` (the target order: an upper-air variable's levels in data order), it
    returns the geopotential (..., L, H, W) from the named temperature, specific humidity and
    surface pressure channels and the raw static surface geopotential `surface_geopotential`
    (H, W), as CREDIT reads it from the inputs before any preblock. `name` is its variable."""

    def __init__(self, section: Mapping[str, Any], channel_variables: Sequence[str],
                 surface_geopotential: np.ndarray) -> None:
        self.name = str(section["output"])
        self.flip_vertical = bool(section["flip_vertical"])
        rows = {}
        for role in ("temperature", "specific_humidity", "surface_pressure"):
            found = [i for i, v in enumerate(channel_variables) if v == section[role]]
            if not found:
                raise DataError(f"data.credit.geopotential.{role}: {section[role]!r} is not an output variable "
                                f"({sorted(set(channel_variables))})")
            rows[role] = found
        if len(rows["surface_pressure"]) != 1:
            raise DataError(f"data.credit.geopotential.surface_pressure: {section['surface_pressure']!r} has "
                            f"{len(rows['surface_pressure'])} channels; a surface variable has one")
        if len(rows["temperature"]) != len(rows["specific_humidity"]):
            raise DataError(f"data.credit.geopotential: temperature has {len(rows['temperature'])} levels, "
                            f"specific humidity {len(rows['specific_humidity'])}")
        self.levels = len(rows["temperature"])
        self.a_half, self.b_half = read_level_info(section["level_info_file"], section["a_half_variable"],
                                                   section["b_half_variable"], section["levels"])
        if len(self.a_half) != self.levels + 1:
            raise DataError(f"{section['level_info_file']}: {len(self.a_half)} interface coefficients; the data's "
                            f"{self.levels} levels of {section['temperature']} need {self.levels + 1} (the "
                            "postblock's `levels` selects the data's model levels from the file's)")
        self.rows = {role: torch.tensor(found) for role, found in rows.items()}
        self.surface_geopotential = torch.as_tensor(np.asarray(surface_geopotential, dtype=np.float32))
        self.variance = float("nan")  # its scaler's, where the loss's scaler file has one
        self.section = section
        self._lowest_surface_pressure: torch.Tensor | None = None  # of any call, kept on the device

    def __call__(self, physical: torch.Tensor) -> torch.Tensor:
        device = physical.device
        picked = {role: physical.index_select(-3, rows.to(device)) for role, rows in self.rows.items()}
        lowest = picked["surface_pressure"].detach().amin()
        self._lowest_surface_pressure = (lowest if self._lowest_surface_pressure is None
                                         else torch.minimum(self._lowest_surface_pressure, lowest))
        return geopotential(self.surface_geopotential.to(device), picked["surface_pressure"],
                            picked["temperature"], picked["specific_humidity"], self.a_half.to(device),
                            self.b_half.to(device), self.flip_vertical)

    def why_not_finite(self) -> str | None:
        """Why the field may be NaN, for a non-finite loss: a surface pressure it was given (an
        untrained or diverging prediction's, most likely) that puts two adjacent interface
        pressures `a_half + b_half sp` at or below zero, where CREDIT's arithmetic, kept here,
        divides zero by zero."""
        if self._lowest_surface_pressure is None:
            return None
        lowest = float(self._lowest_surface_pressure)
        interfaces = self.a_half.double() + self.b_half.double() * lowest
        if not bool(((interfaces[:-1] <= 0) & (interfaces[1:] <= 0)).any()):  # the field is finite
            return None
        return (f"the computed {self.name} (data.credit.geopotential) met a surface pressure "
                f"{self.section['surface_pressure']} of {lowest:.6g} Pa, where its interface pressures a_half + "
                "b_half sp fall to zero and CREDIT's geopotential postblock, whose arithmetic this is, gives NaN too")
