"""Deterministic toy atmosphere used by the synthetic ERA5-layout generator.

The model is small but physically structured, so that a learned emulator has a
real 6-hour map to discover and persistence is clearly imperfect:

* Flow: a non-divergent flow on the sphere given by a streamfunction made of a
  zonal jet (westerlies peaking near 39 degrees, weak tropical easterlies) plus
  a few eastward-propagating planetary (Rossby-like) wave modes whose amplitude
  grows with height, tilts westward with height and is slowly modulated in time.
  Winds come from the analytic derivatives:  u = -1/a dpsi/dphi,
  v = 1/(a cos phi) dpsi/dlambda.
* Temperature: semi-Lagrangian advection by that flow, grid-scale diffusion,
  Newtonian relaxation towards a seasonal radiative-equilibrium profile
  (Held-Suarez-like), diurnal solar heating near the surface (stronger over
  land) and latent heating from condensation.
* Humidity: advection, evaporation source (ocean > land, low levels) towards
  80 % relative humidity, slow precipitation drying and a saturation sink.
* Surface pressure: sea-level pressure in geostrophic-like balance with the
  lowest-level streamfunction (p' = rho f psi), reduced hydrostatically over
  orography with the lowest-level temperature.
* 2-m temperature: lowest-level temperature brought to the surface along a
  6.5 K/km lapse rate, plus a land-amplified skin anomaly driven by the
  instantaneous top-of-atmosphere irradiance.

All randomness (wave numbers, phases, continents, mountains) is drawn once from
``numpy.random.default_rng(seed)``; the integration itself is deterministic.

Performance notes. The generator takes tens of thousands of hourly steps on small grids, so the
stepping code is written for speed, under one rule: every value is bitwise the same as with the
plain formulas (as in the docstrings and comments), because datasets written before must stay
reproducible. Each arithmetic expression keeps its operation order and operand types, so the
code only changes *where* things are computed, never *how*:

* Everything that depends on time only (winds, departure points, interpolation indices and
  weights, radiation) is computed by :meth:`ToyAtmosphere.advance` for a batch of steps at once,
  with a leading time axis; only the state update runs step by step.
* Constants (per grid, per wave mode, per step length) are cached once.
* The time loop works in place (``out=``) in preallocated buffers: large fresh arrays come from
  mmap and pay a page fault per 4 KiB on first touch.
* np.roll / fancy indexing / np.mod / np.rad2deg are replaced by equivalent but faster
  operations (shifted adds on flattened arrays, flat ``np.take``, np.mod only where it is not
  the identity, the multiply np.rad2deg is defined as).

When changing anything here, check that a generated dataset is still bitwise identical to one
written before the change. The parts live beside this module: `constants`, `solar` (geometry
and irradiance), `static_fields` (land-sea mask, orography) and `advection` (semi-Lagrangian
transport and diffusion); this one holds the flow, the tendencies and the state.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .advection import Forcing, SphereGrid, Workspace, departure_indices, diffuse, interpolate, interpolation_plan
from .constants import EARTH_RADIUS, GRAVITY, LAPSE_RATE, LATENT_OVER_CP, OMEGA, R_DRY
from .solar import daily_mean_irradiance_of, solar_geometry, solar_geometry_of, toa_irradiance, toa_irradiance_of
from .static_fields import make_static

_BATCH_STEPS = 24  # at most this many steps have their state-independent forcing computed together
_BATCH_BYTES = 64 * 2**20  # ... and the forcing buffers of a batch stay within about this size
def saturation_specific_humidity(temp: np.ndarray, pressure_pa: np.ndarray, *, out: np.ndarray | None = None,
                                 work: np.ndarray | None = None) -> np.ndarray:
    """Saturation specific humidity [kg kg-1] from a Tetens/Bolton vapour pressure over water.

    ``611.2 exp(17.67 (T - 273.15) / (T - 29.65))`` capped at half the pressure, then
    ``0.622 e_s / (p - 0.378 e_s)``. ``out`` and ``work`` (float64, the broadcast shape) optionally
    receive the result and serve as scratch, so the time loop allocates nothing.
    """
    if out is None:
        out = np.empty(np.broadcast_shapes(np.shape(temp), np.shape(pressure_pa)))
    if work is None:
        work = np.empty_like(out)
    e_s = np.multiply(17.67, np.subtract(temp, 273.15, out=out), out=out)
    np.divide(e_s, np.subtract(temp, 29.65, out=work), out=e_s)
    np.multiply(611.2, np.exp(e_s, out=e_s), out=e_s)
    np.minimum(e_s, 0.5 * pressure_pa, out=e_s)  # keep q_sat finite in very hot, low-pressure air
    denominator = np.subtract(pressure_pa, np.multiply(0.378, e_s, out=work), out=work)
    q_sat = np.divide(np.multiply(0.622, e_s, out=e_s), denominator, out=e_s)
    return q_sat if q_sat.ndim else q_sat[()]  # a scalar for scalar arguments


class ToyAtmosphere:
    """State and tendencies of the toy atmosphere on a regular (lat, lon) grid.

    ``levels_hpa`` may be in any order; arrays use that order on axis 0.
    The state is advanced with :meth:`step` or :meth:`advance` (``dt`` seconds per step) and read
    with :meth:`snapshot`.
    """

    def __init__(self, lat_deg: np.ndarray, lon_deg: np.ndarray, levels_hpa, seed: int):
        rng = np.random.default_rng(seed)
        self.lat, self.lon = np.asarray(lat_deg, float), np.asarray(lon_deg, float)
        self.p = np.asarray(levels_hpa, float)[:, None, None]  # hPa, (L, 1, 1)
        self.low = int(np.argmax(self.p[:, 0, 0]))  # index of the lowest (highest-pressure) level
        self.lsm, self.z_sfc = make_static(rng, self.lat, self.lon)
        phi = np.deg2rad(self.lat)[:, None]
        self.sin, self.cos = np.sin(phi), np.cos(phi)
        self.lam = np.deg2rad(self.lon)[None, :]
        sigma = self.p / 1000.0
        # Jet speed grows with height; easterlies are strongest near the surface.
        self.u_jet = (5.0 + 35.0 * np.clip(1.0 - sigma, 0.0, 1.0)) * 4.0 * self.sin**2 * self.cos**3 / 0.744
        self.u_jet = self.u_jet - 4.0 * sigma * self.cos**6
        fine = np.linspace(-np.pi / 2, np.pi / 2, 2001)
        psi_jet = []  # psi = -a * integral(u dphi) from the south pole, done on a fine grid
        for s in sigma[:, 0, 0]:
            u = (5.0 + 35.0 * max(0.0, 1.0 - s)) * 4.0 * np.sin(fine) ** 2 * np.cos(fine) ** 3 / 0.744
            u = u - 4.0 * s * np.cos(fine) ** 6
            cum = np.concatenate([[0.0], np.cumsum(0.5 * (u[1:] + u[:-1]) * np.diff(fine))])
            psi_jet.append(np.interp(phi[:, 0], fine, -EARTH_RADIUS * cum))
        self.psi_jet = np.asarray(psi_jet)[:, :, None]
        # Wave modes: zonal wavenumber m, eastward angular phase speed, velocity scale,
        # hemispheric asymmetry b, phase, westward tilt with height, amplitude modulation.
        n_modes = 5
        self.m = rng.choice([2, 3, 4, 5, 6, 7], size=n_modes, replace=False).astype(float)
        self.omega = np.deg2rad(rng.uniform(6.0, 16.0, n_modes)) / 86400.0 * self.m  # rad s-1
        # Velocity scale = peak meridional wind: normalise by the maximum of cos^(m-1) sin^2.
        peak = ((self.m - 1) / (self.m + 1)) ** ((self.m - 1) / 2) * 2 / (self.m + 1)
        self.vel = rng.uniform(6.0, 12.0, n_modes) / peak
        self.asym = rng.uniform(-0.5, 0.5, n_modes)
        self.phase = rng.uniform(0.0, 2.0 * np.pi, n_modes)
        self.tilt = rng.uniform(0.3, 0.8, n_modes)
        self.mod_freq = 2.0 * np.pi / (rng.uniform(6.0, 20.0, n_modes) * 86400.0)
        self.mod_phase = rng.uniform(0.0, 2.0 * np.pi, n_modes)
        self.vert = (0.45 + 0.55 * np.clip((1000.0 - self.p) / 700.0, 0.0, 1.0))  # (L,1,1)
        self.state: dict[str, np.ndarray] | None = None
        self._waves = self._wave_constants()
        self._cache_grid_constants()

    def _wave_constants(self) -> dict[str, np.ndarray]:
        """Time-independent factors of the wave modes for :meth:`_winds`.

        Each is computed for one mode at a time, exactly as in the per-mode formulas, then stacked on
        a leading mode axis and shaped to broadcast with (mode, time, level, lat, lon).
        """
        s, c = self.sin[None], self.cos[None]
        per_mode = []
        for m, b, tilt in zip(self.m, self.asym, self.tilt):
            per_mode.append(dict(
                lam=m * self.lam[None],
                tilt=tilt * (self.p - 500.0) / 500.0,
                shape=c**m * s**2 * (1.0 + b * s),  # P(phi)
                dshape=-m * c ** (m - 1) * s**3 * (1.0 + b * s) + c ** (m + 1) * s * (2.0 + 3.0 * b * s),
                c_m1=c ** (m - 1),
                bs=1.0 + b * s,
            ))
        waves = {key: np.stack([d[key] for d in per_mode])[:, None] for key in per_mode[0]}
        column = (slice(None), None, None, None, None)  # (K,) -> (K, 1, 1, 1, 1)
        waves.update(amp=(self.vel * EARTH_RADIUS / self.m)[:, None], mod_freq=self.mod_freq[:, None],
                     mod_phase=self.mod_phase[:, None], omega=self.omega[column], phase=self.phase[column],
                     m=self.m[column], s2=s**2)
        return waves

    def _cache_grid_constants(self) -> None:
        """Grid, level and land-sea factors of the tendencies that never change during a run."""
        day = 86400.0
        sigma = self.p / 1000.0
        self._season_scale = 12.0 * self.sin  # factors of the equilibrium temperature
        self._sin_tilt = np.sin(np.deg2rad(23.44))
        self._t_base = 305.0 - 60.0 * self.sin**2
        self._t_log = 10.0 * np.log(self.p / 1000.0) * self.cos**2
        self._sigma_pow = (self.p / 1000.0) ** 0.19
        # Newtonian cooling rate: fast near the surface (4 d), slow aloft (40 d).
        self._k_t = 1.0 / (40 * day) + (1.0 / (4 * day) - 1.0 / (40 * day)) * np.clip((sigma - 0.7) / 0.3, 0.0, 1.0)
        self._depth = np.clip((self.p - 400.0) / 600.0, 0.0, 1.0) ** 3  # (L,1,1), heating and moistening
        self._moistening = 0.15 + 0.85 * self._depth
        self._evaporation = 1.0 - 0.6 * self.lsm
        self._p_pa = self.p * 100.0
        self._neg_tan_phi = -np.tan(np.deg2rad(self.lat)[:, None])
        self._grid = SphereGrid.build(self.lat, self.lon, len(self.p))
        self._cos_hour: dict[float, np.ndarray] = {}  # cos(hour angle) on the grid, per UTC hour
        self._by_dt: dict[float, dict] = {}
        self._work: Workspace | None = None
        self._batch: Forcing | None = None

    def _step_constants(self, dt: float) -> dict:
        """Tendency factors that depend on the step length only (cached per ``dt``); see :meth:`_tendencies`."""
        if dt not in self._by_dt:
            day = 86400.0
            self._by_dt[dt] = dict(
                relax=dt * self._k_t,
                heat=dt / day * 0.02 * self._depth * (0.3 + 0.7 * self.lsm),
                condense=1.0 - np.exp(-dt / (3 * 3600.0)),
                nu=0.01 * dt / 3600.0,
                skin_gain=dt * (4.2e-3 / 3600.0 * (0.2 + 0.8 * self.lsm)),
                skin_decay=np.exp(-dt / (3 * 3600.0)),
            )
        return self._by_dt[dt]

    # ----------------------------------------------------------------- flow
    def flow(self, t_sec: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Winds u, v [m s-1] and streamfunction [m2 s-1], each (L, H, W), at model time ``t_sec``."""
        shape = (1, len(self.p), len(self.lat), len(self.lon))
        u, v, psi, tmp = np.empty(shape), np.empty(shape), np.empty(shape), np.empty(shape)
        self._winds(np.array([t_sec], float), u, v, tmp, psi)
        return u[0], v[0], psi[0]

    def _winds(self, t_sec: np.ndarray, u: np.ndarray, v: np.ndarray, tmp: np.ndarray,
               psi: np.ndarray | None = None) -> None:
        """Fill u, v (and psi) at each time of ``t_sec`` (T,), arrays (T, L, H, W); ``tmp`` is scratch.

        Per wave mode (wavenumber m, asymmetry b), added to the jet in mode order::

            A = vel a / m (1 + 0.35 sin(mod_freq t + mod_phase)) * vert(p)
            arg = m lambda - omega t + phase + tilt (p - 500) / 500
            psi += A P(phi) cos(arg),       P = cos^m sin^2 (1 + b sin)
            u -= A P'(phi) cos(arg) / a
            v -= A m cos^(m-1) sin^2 (1 + b sin) sin(arg) / a

        Batching over time and modes only adds leading axes to broadcast over: every element goes
        through the same operations, in the same order, as for a single time and mode.
        """
        u[...] = self.u_jet
        v[...] = 0.0
        if psi is not None:
            psi[...] = self.psi_jet
        w = self._waves
        # The per-mode factors of all modes at once, (mode, time, level, lat or lon).
        amp = w["amp"] * (1.0 + 0.35 * np.sin(w["mod_freq"] * t_sec + w["mod_phase"]))
        amp = amp[:, :, None, None, None] * self.vert
        arg = w["lam"] - w["omega"] * t_sec[:, None, None, None] + w["phase"] + w["tilt"]
        cos_arg, sin_arg = np.cos(arg), np.sin(arg)
        u_factor = amp * w["dshape"]
        v_factor = amp * w["m"] * w["c_m1"] * w["s2"] * w["bs"]
        psi_factor = amp * w["shape"] if psi is not None else None
        for k in range(len(self.m)):  # modes are summed in order
            if psi is not None:
                psi += np.multiply(psi_factor[k], cos_arg[k], out=tmp)
            u -= np.divide(np.multiply(u_factor[k], cos_arg[k], out=tmp), EARTH_RADIUS, out=tmp)
            v -= np.divide(np.multiply(v_factor[k], sin_arg[k], out=tmp), EARTH_RADIUS, out=tmp)

    # ------------------------------------------------------------ radiation
    def equilibrium_temperature(self, time_ns: int) -> np.ndarray:
        """Seasonal radiative-equilibrium temperature [K], (L, H, 1)."""
        return self._equilibrium(solar_geometry(time_ns)[0])

    def _equilibrium(self, dec):
        """Equilibrium temperature for declination ``dec`` (a scalar, or (T, 1, 1, 1) for (T, L, H, 1)).

        ``max(205, (305 - 60 sin^2 + 12 sin sin(dec) / sin(23.44) - 10 log(p/1000) cos^2) (p/1000)^0.19)``.
        """
        season = self._season_scale * np.sin(dec) / self._sin_tilt
        return np.maximum(205.0, (self._t_base + season - self._t_log) * self._sigma_pow)

    def _irradiance_excess(self, dec: np.ndarray, dist: np.ndarray, hour: np.ndarray) -> np.ndarray:
        """Instantaneous minus daily-mean TOA irradiance on the grid, (T, H, W), for (T,) geometries."""
        for h in hour:
            if h not in self._cos_hour:  # the hour angle depends on the UTC hour only
                self._cos_hour[h] = np.cos(np.deg2rad(15.0 * (h - 12.0) + self.lon)[None, :])
        cos_h = np.stack([self._cos_hour[h] for h in hour])
        dec, dist = dec[:, None, None], dist[:, None, None]
        toa = toa_irradiance_of(self.sin, self.cos, cos_h, dec, dist)
        return toa - daily_mean_irradiance_of(self.sin, self.cos, self._neg_tan_phi, dec, dist)

    def initialise(self, time_ns: int) -> None:
        """Reset the state to radiative equilibrium, half-saturated air and no skin anomaly."""
        shape = (len(self.p), len(self.lat), len(self.lon))
        temp = np.broadcast_to(self.equilibrium_temperature(time_ns), shape).copy()
        q = 0.5 * saturation_specific_humidity(temp, self.p * 100.0)
        self.state = {"T": temp, "Q": q, "skin": np.zeros(shape[1:])}

    # ------------------------------------------------------------- stepping
    def _forcing(self, t_sec: Sequence[float], time_ns: Sequence[int], dt: float, batch: Forcing) -> Forcing:
        """Fill ``batch`` with what the steps starting at ``t_sec``/``time_ns`` need that does not depend on the state.

        Evaluated at the mid-step instants for a batch of steps (leading axis), as :meth:`step`
        would one at a time.
        """
        n = batch.n = len(t_sec)
        const = self._step_constants(dt)
        mid_sec = np.array([t + 0.5 * dt for t in t_sec], float)
        dec, dist, hour = solar_geometry_of(np.array([ns + int(0.5 * dt * 1e9) for ns in time_ns], np.int64))
        u, v = batch.u[:n], batch.v[:n]
        self._winds(mid_sec, u, v, batch.tmp[:n])
        i, j = departure_indices(self._grid, u, v, dt, (batch.mask[:n], batch.mask2[:n]))
        interpolation_plan(self._grid, i, j, batch)
        excess = self._irradiance_excess(dec, dist, hour)
        np.multiply(const["heat"], excess[:, None], out=batch.heating[:n])
        np.multiply(const["skin_gain"], excess, out=batch.skin[:n])
        batch.t_eq[:n] = self._equilibrium(dec[:, None, None, None])
        return batch

    def step(self, t_sec: float, time_ns: int, dt: float) -> None:
        """Advance the state from ``t_sec`` (model seconds; ``time_ns`` the same instant) by ``dt`` s."""
        self.advance([t_sec], [time_ns], dt)

    def advance(self, t_sec: Sequence[float], time_ns: Sequence[int], dt: float) -> None:
        """Take ``len(t_sec)`` steps of ``dt`` s; step ``k`` starts at ``t_sec[k]`` (model s) = ``time_ns[k]``.

        Same result, to the bit, as calling :meth:`step` for each in turn, but the state-independent
        part (winds, departure points, radiation) is computed for batches of steps at once.
        """
        st = self.state
        const = self._step_constants(dt)
        tq = np.stack([st["T"], st["Q"]])  # temperature and humidity are advected and diffused together
        skin = st["skin"].copy()
        if self._work is None:
            steps = int(np.clip(_BATCH_BYTES // (Forcing.BYTES_PER_POINT * tq[0].size), 1, _BATCH_STEPS))
            self._work, self._batch = Workspace(tq.shape), Forcing(steps, tq.shape[1:])
        work, batch = self._work, self._batch
        for start in range(0, len(t_sec), batch.size):
            self._forcing(t_sec[start:start + batch.size], time_ns[start:start + batch.size], dt, batch)
            for k in range(batch.n):
                interpolate(tq, batch, k, work)  # semi-Lagrangian advection into work.tq
                self._tendencies(work.tq, batch, k, const, dt, work)
                diffuse(work.tq, const["nu"], work.lap, out=tq, edge=work.edge)  # back into the state
                np.maximum(tq[1], 0.0, out=tq[1])
                # Skin anomaly behind the 2-m temperature diurnal cycle: driven by irradiance, damped
                # in 3 h:  skin = (skin + dt * gain * excess) * exp(-dt / 3 h)
                np.multiply(np.add(skin, batch.skin[k], out=skin), const["skin_decay"], out=skin)
        st["T"], st["Q"], st["skin"] = tq[0], tq[1], skin

    def _tendencies(self, tq: np.ndarray, batch: Forcing, k: int, const: dict, dt: float, work: Workspace) -> None:
        """Relaxation, heating, evaporation, drying and condensation of step ``k``, in place on ``tq``.

        The formula of each block is in its comment; the calls evaluate it in the same order.
        """
        temp, q = tq[0], tq[1]
        tmp, q_sat, source = work.tmp, work.q_sat, work.source
        day = 86400.0
        # Newtonian cooling, fast near the surface (4 d), slow aloft (40 d), as in Held & Suarez:
        #   temp = temp - dt * k_t * (temp - t_eq)
        np.subtract(temp, np.multiply(const["relax"], np.subtract(temp, batch.t_eq[k], out=tmp), out=tmp), out=temp)
        # Diurnal heating: the departure of the instantaneous irradiance from its daily mean,
        # absorbed mostly in the lowest layers and three times more strongly over land:
        #   temp = temp + dt / day * 0.02 * depth * (0.3 + 0.7 * lsm) * excess
        np.add(temp, batch.heating[k], out=temp)
        # Humidity: evaporation towards 80 % RH (ocean-fed, strongest at low levels; a weak part
        # aloft stands in for convective moistening, without which the upper levels would dry
        # out for good), precipitation drying (10 d):
        #   source = max(0.8 * q_sat - q, 0) * moistening * (1 - 0.6 * lsm) / (1.5 * day)
        #   q = q + dt * (source - q / (10 * day))
        saturation_specific_humidity(temp, self._p_pa, out=q_sat, work=tmp)
        np.maximum(np.subtract(np.multiply(0.8, q_sat, out=source), q, out=source), 0.0, out=source)
        np.multiply(source, self._moistening, out=source)
        np.multiply(source, self._evaporation, out=source)
        np.divide(source, 1.5 * day, out=source)
        np.subtract(source, np.divide(q, 10 * day, out=tmp), out=source)
        np.add(q, np.multiply(dt, source, out=source), out=q)
        # Condensation of supersaturated air within ~3 h, releasing latent heat:
        #   condensed = max(q - q_sat, 0) * (1 - exp(-dt / 3 h)); q = q - condensed
        #   temp = temp + LATENT_OVER_CP * condensed
        condensed = np.maximum(np.subtract(q, q_sat, out=tmp), 0.0, out=tmp)
        np.multiply(condensed, const["condense"], out=condensed)
        np.subtract(q, condensed, out=q)
        np.add(temp, np.multiply(LATENT_OVER_CP, condensed, out=condensed), out=temp)

    def snapshot(self, t_sec: float, time_ns: int) -> dict[str, np.ndarray]:
        """All output variables at the current state (float64): U, V, T, Q (L,H,W); SP, t2m, tsi (H,W)."""
        u, v, psi = self.flow(t_sec)
        st = self.state
        t_low = st["T"][self.low]
        f = 2.0 * OMEGA * self.sin
        area = np.broadcast_to(self.cos, t_low.shape)
        # Surface flow taken as 60 % of the lowest-level flow (friction), density 1.2 kg m-3.
        p_dyn = 0.6 * 1.2 * f * psi[self.low]
        p_dyn = p_dyn - (p_dyn * area).sum() / area.sum()  # the balanced part conserves global mass
        sp = (101325.0 + p_dyn) * np.exp(-self.z_sfc / (R_DRY * t_low))
        p_low = self.p[self.low, 0, 0] * 100.0
        dz = R_DRY * t_low / GRAVITY * np.log(sp / p_low)  # height of the surface below the lowest level
        t2m = t_low + LAPSE_RATE * dz + st["skin"]
        return {"U": u, "V": v, "T": st["T"].copy(), "Q": st["Q"].copy(), "SP": sp, "t2m": t2m,
                "tsi": toa_irradiance(time_ns, self.lat, self.lon)}
