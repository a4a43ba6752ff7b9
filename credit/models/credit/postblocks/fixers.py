"""CREDIT's post blocks (`credit/postblock/gen1.py` in CREDIT): the tracer fixer and the
global mass, water and energy fixers, applied to a forecast inside the model's forward, as CREDIT's
two CrossFormers apply them, or after it (`activate_outside_model`), as CREDIT's trainer and
rollout do.

Each fixer takes the normalised forecast y (B, C_out, 1, H, W) and the model's input x
(B, C_in, T, H, W), de-normalises y (and the state channels of x's last frame), corrects
its channels in physical units and normalises the result again; fixers run one after
another, each with its own round trip, as in CREDIT, so the numbers are CREDIT's. The
global sums are over the whole grid: a fixer runs on the gathered forecast, which every
tensor- and sequence-parallel rank holds whole after the model, so no collective is needed
and every rank of a tensor-parallel group computes the same bits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from credit.models.credit.postblocks.physics import CP_DRY, CP_VAPOR, GRAVITY, LH_WATER, RHO_WATER, ColumnPhysics
from credit.models.credit.postblocks.settings import ChannelLayout, PostBlockConfigError


class Fixer(nn.Module):
    """De-normalise, correct, normalise: `correct(Y, X)` sees physical (B, C, H, W) tensors,
    Y the forecast, X the state channels of the input's last frame (None if unused)."""

    key = ""  # the post_conf section, in errors and logs
    uses_input = True

    def __init__(self, layout: ChannelLayout, denorm: bool) -> None:
        super().__init__()
        self.denorm = denorm and layout.normalized  # un-normalised data are physical already
        self.register_buffer("mean", layout.mean.view(1, -1, 1, 1, 1), persistent=False)
        self.register_buffer("std", layout.std.view(1, -1, 1, 1, 1), persistent=False)
        self.state_channels = layout.state_channels

    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        physical = y * self.std + self.mean if self.denorm else y
        state = None
        if self.uses_input:
            state = x[:, :self.state_channels].detach().to(y.device)
            if self.denorm:
                state = state * self.std[:, :self.state_channels] + self.mean[:, :self.state_channels]
            state = state[:, :, -1]
        fixed = self.correct(physical[:, :, 0], state).unsqueeze(2)
        return (fixed - self.mean) / self.std if self.denorm else fixed

    def correct(self, y: torch.Tensor, x: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError


def splice(y: torch.Tensor, block: torch.Tensor, where: slice) -> torch.Tensor:
    """y with channels `where` replaced by `block`, out of place (autograd keeps y's graph)."""
    return torch.cat([y[:, :where.start], block, y[:, where.stop:]], dim=1)


def _per_sample(ratio: torch.Tensor, dims: int) -> torch.Tensor:
    return ratio.view(-1, *([1] * dims))


class TracerFixer(Fixer):
    """Tracers below their threshold are set to it (and, with `tracer_thres_max`, those at
    or above the maximum to it)."""

    key = "tracer_fixer"
    uses_input = False

    def __init__(self, conf: Mapping[str, Any], layout: ChannelLayout) -> None:
        super().__init__(layout, bool(conf.get("denorm", True)))
        names, low, high = list(conf["tracer_name"]), conf.get("tracer_thres"), conf.get("tracer_thres_max")
        for key, values in (("tracer_thres", low), ("tracer_thres_max", high)):
            if values is not None and len(values) != len(names):
                raise PostBlockConfigError(f"post_conf.tracer_fixer.{key} has {len(values)} values for "
                                           f"{len(names)} tracer_name entries")
        if low is None:
            raise PostBlockConfigError("post_conf.tracer_fixer.tracer_thres is not set")
        self.channels = layout.indices(names, "tracer_fixer.tracer_name")
        # one threshold per channel: an upper-air tracer repeats its own at every level
        by_name = {n: i for i, n in enumerate(names)}
        self.low = [float(low[by_name[layout.output_names[c]]]) for c in self.channels]
        self.high = None if high is None else [float(high[by_name[layout.output_names[c]]]) for c in self.channels]

    def correct(self, y: torch.Tensor, x: torch.Tensor | None) -> torch.Tensor:
        columns = list(y.unbind(1))
        for i, c in enumerate(self.channels):
            value = columns[c]
            value = torch.where(value < self.low[i], torch.full_like(value, self.low[i]), value)
            if self.high is not None:
                value = torch.where(value >= self.high[i], torch.full_like(value, self.high[i]), value)
            columns[c] = value
        return torch.stack(columns, dim=1)


class ConservationFixer(Fixer):
    """Shared by the global fixers: the grid, the seconds per step, surface pressure."""

    def __init__(self, conf: Mapping[str, Any], layout: ChannelLayout, physics: ColumnPhysics,
                 seconds: int) -> None:
        super().__init__(layout, bool(conf.get("denorm", True)))
        self.physics, self.seconds = physics, seconds
        self.water = layout.contiguous(list(conf["specific_total_water_name"]),
                                       f"{self.key}.specific_total_water_name")
        self.sp = None
        if physics.sigma:
            self.sp = layout.indices(list(conf.get("surface_pressure_name") or []),
                                     f"{self.key}.surface_pressure_name")[0]

    def _sp(self, t: torch.Tensor) -> torch.Tensor | None:
        return t[:, self.sp] if self.sp is not None else None


class GlobalMassFixer(ConservationFixer):
    """Global dry-air mass of the input kept: pressure levels rescale the moisture of the
    lowest `fix_level_num` levels, sigma levels the surface pressure."""

    key = "global_mass_fixer"

    def __init__(self, conf: Mapping[str, Any], layout: ChannelLayout, physics: ColumnPhysics, seconds: int) -> None:
        super().__init__(conf, layout, physics, seconds)
        if "fix_level_num" not in conf:
            raise PostBlockConfigError("post_conf.global_mass_fixer.fix_level_num is not set")
        levels = physics.levels()
        self.ind_fix = levels - int(conf["fix_level_num"]) + 1
        self.start = self.ind_fix if physics.midpoint else self.ind_fix - 1

    def correct(self, y: torch.Tensor, x: torch.Tensor | None) -> torch.Tensor:
        p = self.physics
        q0, q1 = x[:, self.water], y[:, self.water]
        mass_t0 = p.total_dry_air_mass(q0, self._sp(x))
        if not p.sigma:
            levels = p.levels()
            held = p.weighted_sum(p.integral_sliced(1 - q1, 0, self.ind_fix) / GRAVITY)
            fixed = p.weighted_sum(p.integral_sliced(1 - q1, self.start, levels) / GRAVITY)
            ratio = _per_sample((mass_t0 - held) / fixed, 3)
            q1 = torch.cat([q1[:, :self.start], 1 - (1 - q1[:, self.start:]) * ratio], dim=1)
            return splice(y, q1, self.water)
        delta_a, delta_b = p.coef_a.diff().view(1, -1, 1, 1), p.coef_b.diff().view(1, -1, 1, 1)
        q_mid = q1 if p.midpoint else (q1[:, :-1] + q1[:, 1:]) / 2
        dry_a, dry_b = (delta_a * (1 - q_mid)).sum(1), (delta_b * (1 - q_mid)).sum(1)
        sp1 = y[:, self.sp]
        mass_a = p.weighted_sum(dry_a) / GRAVITY
        mass_b = p.weighted_sum(dry_b * sp1) / GRAVITY
        sp1 = sp1 * _per_sample((mass_t0 - mass_a) / mass_b, 2)
        return splice(y, sp1.unsqueeze(1), slice(self.sp, self.sp + 1))


class GlobalWaterFixer(ConservationFixer):
    """Global water budget closed: precipitation rescaled so that the change in column water
    equals evaporation minus precipitation."""

    key = "global_water_fixer"

    def __init__(self, conf: Mapping[str, Any], layout: ChannelLayout, physics: ColumnPhysics, seconds: int) -> None:
        super().__init__(conf, layout, physics, seconds)
        self.precip = layout.indices(list(conf["precipitation_name"]), "global_water_fixer.precipitation_name")[0]
        self.evapor = layout.indices(list(conf["evaporation_name"]), "global_water_fixer.evaporation_name")[0]

    def correct(self, y: torch.Tensor, x: torch.Tensor | None) -> torch.Tensor:
        p, n = self.physics, self.seconds
        precip, evapor = y[:, self.precip], y[:, self.evapor]
        precip_flux, evapor_flux = precip * RHO_WATER / n, evapor * RHO_WATER / n
        water_t0 = p.total_column_water(x[:, self.water], self._sp(x))
        water_t1 = p.total_column_water(y[:, self.water], self._sp(y))
        tendency = p.weighted_sum((water_t1 - water_t0) / n)
        sum_e, sum_p = p.weighted_sum(evapor_flux), p.weighted_sum(precip_flux)
        residual = -tendency - sum_e - sum_p
        precip = precip * _per_sample((sum_p + residual) / sum_p, 2)
        return splice(y, precip.unsqueeze(1), slice(self.precip, self.precip + 1))


class GlobalEnergyFixer(ConservationFixer):
    """Global total energy closed by the top-of-atmosphere and surface fluxes: the thermal
    energy (temperature) carries the correction."""

    key = "global_energy_fixer"

    def __init__(self, conf: Mapping[str, Any], layout: ChannelLayout, physics: ColumnPhysics, seconds: int,
                 geopotential: torch.Tensor) -> None:
        super().__init__(conf, layout, physics, seconds)
        name = "global_energy_fixer."
        self.temperature = layout.contiguous(list(conf["air_temperature_name"]), name + "air_temperature_name")
        self.u = layout.contiguous(list(conf["u_wind_name"]), name + "u_wind_name")
        self.v = layout.contiguous(list(conf["v_wind_name"]), name + "v_wind_name")
        self.toa = layout.indices(list(conf["TOA_net_radiation_flux_name"]), name + "TOA_net_radiation_flux_name")
        self.surface_rad = layout.indices(list(conf["surface_net_radiation_flux_name"]),
                                          name + "surface_net_radiation_flux_name")
        self.surface_flux = layout.indices(list(conf["surface_energy_flux_name"]), name + "surface_energy_flux_name")
        self.register_buffer("geopotential", geopotential, persistent=False)

    def _energy(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(heat capacity, latent + potential + kinetic energy, total energy) per level."""
        q = t[:, self.water]
        heat_capacity = (1 - q) * CP_DRY + q * CP_VAPOR
        kinetic = 0.5 * (t[:, self.u] ** 2 + t[:, self.v] ** 2)
        other = LH_WATER * q + self.geopotential + kinetic
        return heat_capacity, other, heat_capacity * t[:, self.temperature] + other

    def correct(self, y: torch.Tensor, x: torch.Tensor | None) -> torch.Tensor:
        p, n = self.physics, self.seconds
        _, _, energy_t0 = self._energy(x)
        heat_capacity, other, energy_t1 = self._energy(y)
        top = p.weighted_sum((y[:, self.toa[0]] + y[:, self.toa[1]]) / n)
        surface = p.weighted_sum((y[:, self.surface_rad[0]] + y[:, self.surface_rad[1]]
                                  + y[:, self.surface_flux[0]] + y[:, self.surface_flux[1]]) / n)
        total_t0 = p.weighted_sum(p.integral(energy_t0, self._sp(x)) / GRAVITY)
        total_t1 = p.weighted_sum(p.integral(energy_t1, self._sp(y)) / GRAVITY)
        ratio = _per_sample((n * (top - surface) + total_t0) / total_t1, 3)
        temperature = (energy_t1 * ratio - other) / heat_capacity
        return splice(y, temperature, self.temperature)


class PostBlocks(nn.Module):
    """The active fixers in CREDIT's order: tracer, mass, water, energy."""

    def __init__(self, fixers: list[Fixer]) -> None:
        super().__init__()
        self.fixers = nn.ModuleList(fixers)

    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        for fixer in self.fixers:
            y = fixer(y, x)
        return y


class OutsidePostBlocks(nn.Module):
    """The conservation fixers CREDIT's trainer and rollout apply after the model
    (`activate_outside_model`), in CREDIT's order: the mass fixer against the forecast's
    initial state, the water and energy fixers against the step's input."""

    def __init__(self, fixers: list[Fixer]) -> None:
        super().__init__()
        self.fixers = nn.ModuleList(fixers)

    def forward(self, y: torch.Tensor, x: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
        for fixer in self.fixers:
            y = fixer(y, initial if isinstance(fixer, GlobalMassFixer) else x)
        return y
