"""Solar geometry and top-of-atmosphere irradiance for the toy atmosphere and its `tsi` field.

The `*_of` forms take precomputed latitude and hour-angle factors and broadcast over a leading
time axis, so `credit.data.physics` evaluates a batch of steps with the same operations, in
the same order, as one step at a time (its datasets stay bitwise reproducible).
"""

from __future__ import annotations

import numpy as np

from .constants import NS_PER_DAY, SOLAR_CONSTANT


def solar_geometry(time_ns: np.ndarray | int) -> tuple[float, float, float]:
    """Return (declination [rad], Earth-Sun distance factor (d0/d)^2, UTC hour) at ``time_ns``.

    Declination and eccentricity use the usual first-harmonic approximations in the
    fractional day of year; the equation of time is neglected.
    """
    dec, dist, hour = solar_geometry_of(np.array([int(time_ns)], np.int64))
    return float(dec[0]), float(dist[0]), float(hour[0])


def solar_geometry_of(time_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`solar_geometry` for an int64 array of times [ns] (elementwise the same operations)."""
    t = time_ns.astype("datetime64[ns]")
    year_start = t.astype("datetime64[Y]").astype("datetime64[ns]")
    day = (t - year_start).astype(np.int64) / NS_PER_DAY  # fractional, 0 at Jan 1 00 UTC
    hour = (t - t.astype("datetime64[D]").astype("datetime64[ns]")).astype(np.int64) / 3.6e12
    gamma = 2.0 * np.pi * day / 365.25
    declination = np.deg2rad(-23.44) * np.cos(gamma + 2.0 * np.pi * 10.0 / 365.25)
    distance_factor = 1.0 + 0.033 * np.cos(gamma)
    return declination, distance_factor, hour


def toa_irradiance(time_ns: int, lat_deg: np.ndarray, lon_deg: np.ndarray) -> np.ndarray:
    """Instantaneous top-of-atmosphere solar irradiance [W m-2] on the (lat, lon) grid.

    ``S0 (d0/d)^2 max(0, cos zenith)``, with ``cos zenith = sin(phi) sin(dec) + cos(phi) cos(dec) cos(h)``
    and hour angle ``h = 15 deg * (UTC hour - 12) + longitude``.
    """
    dec, dist, hour = solar_geometry(time_ns)
    phi = np.deg2rad(lat_deg)[:, None]
    h = np.deg2rad(15.0 * (hour - 12.0) + np.asarray(lon_deg))[None, :]
    return toa_irradiance_of(np.sin(phi), np.cos(phi), np.cos(h), dec, dist)


def toa_irradiance_of(sin_phi: np.ndarray, cos_phi: np.ndarray, cos_h: np.ndarray, dec, dist) -> np.ndarray:
    """TOA irradiance from sin/cos of latitude (H, 1), cos of the hour angle and the solar geometry.

    ``dec`` and ``dist`` are scalars, or (T, 1, 1) with ``cos_h`` (T, 1, W) for a batch of times.
    """
    cos_zen = sin_phi * np.sin(dec) + cos_phi * np.cos(dec) * cos_h
    return SOLAR_CONSTANT * dist * np.maximum(cos_zen, 0.0)


def daily_mean_irradiance(time_ns: int, lat_deg: np.ndarray) -> np.ndarray:
    """Daily-mean top-of-atmosphere irradiance [W m-2] per latitude (shape (H, 1))."""
    dec, dist, _ = solar_geometry(time_ns)
    phi = np.deg2rad(lat_deg)[:, None]
    return daily_mean_irradiance_of(np.sin(phi), np.cos(phi), -np.tan(phi), dec, dist)


def daily_mean_irradiance_of(sin_phi: np.ndarray, cos_phi: np.ndarray, neg_tan_phi: np.ndarray, dec,
                             dist) -> np.ndarray:
    """Daily-mean TOA irradiance from latitude factors (H, 1) and the (scalar or (T, 1, 1)) geometry."""
    h0 = np.arccos(np.clip(neg_tan_phi * np.tan(dec), -1.0, 1.0))
    return SOLAR_CONSTANT * dist / np.pi * (h0 * sin_phi * np.sin(dec) + cos_phi * np.cos(dec) * np.sin(h0))
