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
"""

from __future__ import annotations

import numpy as np

EARTH_RADIUS = 6.371e6  # m
OMEGA = 7.292e-5  # s-1
GRAVITY = 9.80665  # m s-2
R_DRY = 287.04  # J kg-1 K-1
LATENT_OVER_CP = 2.501e6 / 1004.0  # K per (kg kg-1)
SOLAR_CONSTANT = 1361.0  # W m-2
LAPSE_RATE = 6.5e-3  # K m-1
NS_PER_DAY = 86_400 * 10**9


def solar_geometry(time_ns: np.ndarray | int) -> tuple[float, float, float]:
    """Return (declination [rad], Earth-Sun distance factor (d0/d)^2, UTC hour) at ``time_ns``.

    Declination and eccentricity use the usual first-harmonic approximations in the
    fractional day of year; the equation of time is neglected.
    """
    t = np.datetime64(int(time_ns), "ns")
    year_start = t.astype("datetime64[Y]").astype("datetime64[ns]")
    day = (t - year_start).astype(np.int64) / NS_PER_DAY  # fractional, 0 at Jan 1 00 UTC
    hour = (t - t.astype("datetime64[D]").astype("datetime64[ns]")).astype(np.int64) / 3.6e12
    gamma = 2.0 * np.pi * day / 365.25
    declination = np.deg2rad(-23.44) * np.cos(gamma + 2.0 * np.pi * 10.0 / 365.25)
    distance_factor = 1.0 + 0.033 * np.cos(gamma)
    return float(declination), float(distance_factor), float(hour)


def toa_irradiance(time_ns: int, lat_deg: np.ndarray, lon_deg: np.ndarray) -> np.ndarray:
    """Instantaneous top-of-atmosphere solar irradiance [W m-2] on the (lat, lon) grid.

    ``S0 (d0/d)^2 max(0, cos zenith)``, with ``cos zenith = sin(phi) sin(dec) + cos(phi) cos(dec) cos(h)``
    and hour angle ``h = 15 deg * (UTC hour - 12) + longitude``.
    """
    dec, dist, hour = solar_geometry(time_ns)
    phi = np.deg2rad(lat_deg)[:, None]
    h = np.deg2rad(15.0 * (hour - 12.0) + np.asarray(lon_deg))[None, :]
    cos_zen = np.sin(phi) * np.sin(dec) + np.cos(phi) * np.cos(dec) * np.cos(h)
    return SOLAR_CONSTANT * dist * np.maximum(cos_zen, 0.0)


def daily_mean_irradiance(time_ns: int, lat_deg: np.ndarray) -> np.ndarray:
    """Daily-mean top-of-atmosphere irradiance [W m-2] per latitude (shape (H, 1))."""
    dec, dist, _ = solar_geometry(time_ns)
    phi = np.deg2rad(lat_deg)[:, None]
    h0 = np.arccos(np.clip(-np.tan(phi) * np.tan(dec), -1.0, 1.0))
    return SOLAR_CONSTANT * dist / np.pi * (h0 * np.sin(phi) * np.sin(dec) + np.cos(phi) * np.cos(dec) * np.sin(h0))


def saturation_specific_humidity(temp: np.ndarray, pressure_pa: np.ndarray) -> np.ndarray:
    """Saturation specific humidity [kg kg-1] from a Tetens/Bolton vapour pressure over water."""
    e_s = 611.2 * np.exp(17.67 * (temp - 273.15) / (temp - 29.65))
    e_s = np.minimum(e_s, 0.5 * pressure_pa)  # keep q_sat finite in very hot, low-pressure air
    return 0.622 * e_s / (pressure_pa - 0.378 * e_s)


def _smooth_sphere_field(rng: np.random.Generator, lat_deg, lon_deg, n_bumps: int, width: tuple[float, float]):
    """Sum of random Gaussian bumps in 3-D on the unit sphere: smooth, pole-safe, grid-independent."""
    centres = rng.normal(size=(n_bumps, 3))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    widths = rng.uniform(*width, size=n_bumps)
    weights = rng.uniform(0.5, 1.0, size=n_bumps)
    phi, lam = np.deg2rad(lat_deg)[:, None], np.deg2rad(lon_deg)[None, :]
    xyz = np.stack(np.broadcast_arrays(np.cos(phi) * np.cos(lam), np.cos(phi) * np.sin(lam), np.sin(phi)), -1)
    d2 = ((xyz[:, :, None, :] - centres[None, None]) ** 2).sum(-1)
    return (weights * np.exp(-d2 / (2.0 * widths**2))).sum(-1)


def make_static(rng: np.random.Generator, lat_deg: np.ndarray, lon_deg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Seeded land-sea mask (0/1, about 30 % land by area) and surface geopotential [m2 s-2]."""
    land_field = _smooth_sphere_field(rng, lat_deg, lon_deg, 9, (0.25, 0.5))
    area = np.broadcast_to(np.cos(np.deg2rad(lat_deg))[:, None], land_field.shape).ravel()
    order = np.argsort(land_field.ravel())[::-1]
    cum = np.cumsum(area[order]) / area.sum()
    threshold = land_field.ravel()[order][np.searchsorted(cum, 0.3)]
    lsm = (land_field > threshold).astype(np.float64)
    # Height rises smoothly inland and carries a few narrower mountain ranges on land.
    inland = np.clip((land_field - threshold) / (land_field.max() - threshold + 1e-12), 0.0, 1.0)
    ranges = _smooth_sphere_field(rng, lat_deg, lon_deg, 6, (0.08, 0.18))
    height = lsm * (1500.0 * inland**0.7 + 2500.0 * ranges / max(ranges.max(), 1e-12) * inland**0.3 + 50.0)
    return lsm, GRAVITY * height


class ToyAtmosphere:
    """State and tendencies of the toy atmosphere on a regular (lat, lon) grid.

    ``levels_hpa`` may be in any order; arrays use that order on axis 0.
    The state is advanced with :meth:`step` (``dt`` seconds) and read with :meth:`snapshot`.
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

    # ----------------------------------------------------------------- flow
    def flow(self, t_sec: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Winds u, v [m s-1] and streamfunction [m2 s-1], each (L, H, W), at model time ``t_sec``."""
        s, c = self.sin[None], self.cos[None]
        u = np.broadcast_to(self.u_jet, (len(self.p), len(self.lat), len(self.lon))).copy()
        v = np.zeros_like(u)
        psi = np.broadcast_to(self.psi_jet, u.shape).copy()
        for k in range(len(self.m)):
            m, b = self.m[k], self.asym[k]
            amp = self.vel[k] * EARTH_RADIUS / m * (1.0 + 0.35 * np.sin(self.mod_freq[k] * t_sec + self.mod_phase[k]))
            amp = amp * self.vert
            arg = m * self.lam[None] - self.omega[k] * t_sec + self.phase[k] + self.tilt[k] * (self.p - 500.0) / 500.0
            cos_arg, sin_arg = np.cos(arg), np.sin(arg)
            shape = c**m * s**2 * (1.0 + b * s)  # P(phi)
            dshape = -m * c ** (m - 1) * s**3 * (1.0 + b * s) + c ** (m + 1) * s * (2.0 + 3.0 * b * s)
            psi += amp * shape * cos_arg
            u -= amp * dshape * cos_arg / EARTH_RADIUS
            v -= amp * m * c ** (m - 1) * s**2 * (1.0 + b * s) * sin_arg / EARTH_RADIUS
        return u, v, psi

    # ------------------------------------------------------------ radiation
    def equilibrium_temperature(self, time_ns: int) -> np.ndarray:
        """Seasonal radiative-equilibrium temperature [K], (L, H, 1)."""
        dec, _, _ = solar_geometry(time_ns)
        season = 12.0 * self.sin * np.sin(dec) / np.sin(np.deg2rad(23.44))
        t_surface = 305.0 - 60.0 * self.sin**2 + season - 10.0 * np.log(self.p / 1000.0) * self.cos**2
        return np.maximum(205.0, t_surface * (self.p / 1000.0) ** 0.19)

    def initialise(self, time_ns: int) -> None:
        """Reset the state to radiative equilibrium, half-saturated air and no skin anomaly."""
        shape = (len(self.p), len(self.lat), len(self.lon))
        temp = np.broadcast_to(self.equilibrium_temperature(time_ns), shape).copy()
        q = 0.5 * saturation_specific_humidity(temp, self.p * 100.0)
        self.state = {"T": temp, "Q": q, "skin": np.zeros(shape[1:])}

    # ------------------------------------------------------------- stepping
    def _departure_indices(self, u, v, dt):
        """Fractional (lat, lon) grid indices of the semi-Lagrangian departure points."""
        cos = np.maximum(self.cos, np.cos(np.deg2rad(89.0)))  # u vanishes at the poles; avoid 0/0
        lam_d = np.rad2deg(self.lam - u * dt / (EARTH_RADIUS * cos))
        phi_d = np.rad2deg(np.deg2rad(self.lat)[:, None] - v * dt / EARTH_RADIUS)
        dlat, dlon = self.lat[1] - self.lat[0], self.lon[1] - self.lon[0]
        i = np.clip((phi_d - self.lat[0]) / dlat, 0.0, len(self.lat) - 1.0)
        j = np.mod((lam_d - self.lon[0]) / dlon, len(self.lon))
        return i, j

    @staticmethod
    def _bilinear(fields, i, j):
        """Interpolate each (L, H, W) field at fractional indices (periodic in longitude)."""
        n_lat, n_lon = fields[0].shape[1:]
        i0 = np.minimum(np.floor(i).astype(np.int64), n_lat - 2)
        j0 = np.floor(j).astype(np.int64) % n_lon
        wi, wj = i - i0, j - np.floor(j)
        j1 = (j0 + 1) % n_lon
        level = np.arange(fields[0].shape[0])[:, None, None]
        out = []
        for f in fields:
            out.append((1 - wi) * ((1 - wj) * f[level, i0, j0] + wj * f[level, i0, j1])
                       + wi * ((1 - wj) * f[level, i0 + 1, j0] + wj * f[level, i0 + 1, j1]))
        return out

    @staticmethod
    def _diffuse(f, nu):
        """Grid-scale diffusion (5-point Laplacian in index space; periodic lon, no-flux lat)."""
        padded = np.concatenate([f[:, :1], f, f[:, -1:]], axis=1)
        lap = padded[:, :-2] + padded[:, 2:] + np.roll(f, 1, -1) + np.roll(f, -1, -1) - 4.0 * f
        return f + nu * lap

    def step(self, t_sec: float, time_ns: int, dt: float) -> None:
        """Advance the state from ``t_sec`` (model seconds; ``time_ns`` the same instant) by ``dt`` s."""
        st = self.state
        mid_sec, mid_ns = t_sec + 0.5 * dt, time_ns + int(0.5 * dt * 1e9)
        u, v, _ = self.flow(mid_sec)
        i, j = self._departure_indices(u, v, dt)
        temp, q = self._bilinear([st["T"], st["Q"]], i, j)
        day = 86400.0
        # Newtonian cooling: fast near the surface (4 d), slow aloft (40 d), as in Held & Suarez.
        sigma = self.p / 1000.0
        k_t = 1.0 / (40 * day) + (1.0 / (4 * day) - 1.0 / (40 * day)) * np.clip((sigma - 0.7) / 0.3, 0.0, 1.0)
        temp = temp - dt * k_t * (temp - self.equilibrium_temperature(mid_ns))
        # Diurnal heating: the departure of the instantaneous irradiance from its daily mean,
        # absorbed mostly in the lowest layers and three times more strongly over land.
        excess = toa_irradiance(mid_ns, self.lat, self.lon) - daily_mean_irradiance(mid_ns, self.lat)
        depth = np.clip((self.p - 400.0) / 600.0, 0.0, 1.0) ** 3  # (L,1,1)
        temp = temp + dt / day * 0.02 * depth * (0.3 + 0.7 * self.lsm) * excess
        # Humidity: evaporation towards 80 % RH (ocean-fed, strongest at low levels; a weak part
        # aloft stands in for convective moistening, without which the upper levels would dry
        # out for good), precipitation drying (10 d).
        p_pa = self.p * 100.0
        q_sat = saturation_specific_humidity(temp, p_pa)
        moistening = 0.15 + 0.85 * depth
        source = np.maximum(0.8 * q_sat - q, 0.0) * moistening * (1.0 - 0.6 * self.lsm) / (1.5 * day)
        q = q + dt * (source - q / (10 * day))
        # Condensation of supersaturated air within ~3 h, releasing latent heat.
        condensed = np.maximum(q - q_sat, 0.0) * (1.0 - np.exp(-dt / (3 * 3600.0)))
        q = q - condensed
        temp = temp + LATENT_OVER_CP * condensed
        st["T"] = self._diffuse(temp, 0.01 * dt / 3600.0)
        st["Q"] = np.maximum(self._diffuse(q, 0.01 * dt / 3600.0), 0.0)
        # Skin anomaly behind the 2-m temperature diurnal cycle: driven by irradiance, damped in 3 h.
        gain = 4.2e-3 / 3600.0 * (0.2 + 0.8 * self.lsm)
        st["skin"] = (st["skin"] + dt * gain * excess) * np.exp(-dt / (3 * 3600.0))

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
