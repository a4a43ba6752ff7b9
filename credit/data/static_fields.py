"""The toy atmosphere's seeded static fields: land-sea mask and surface geopotential."""

from __future__ import annotations

import numpy as np

from .constants import GRAVITY


def smooth_sphere_field(rng: np.random.Generator, lat_deg, lon_deg, n_bumps: int, width: tuple[float, float]):
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
    land_field = smooth_sphere_field(rng, lat_deg, lon_deg, 9, (0.25, 0.5))
    area = np.broadcast_to(np.cos(np.deg2rad(lat_deg))[:, None], land_field.shape).ravel()
    order = np.argsort(land_field.ravel())[::-1]
    cum = np.cumsum(area[order]) / area.sum()
    threshold = land_field.ravel()[order][np.searchsorted(cum, 0.3)]
    lsm = (land_field > threshold).astype(np.float64)
    # Height rises smoothly inland and carries a few narrower mountain ranges on land.
    inland = np.clip((land_field - threshold) / (land_field.max() - threshold + 1e-12), 0.0, 1.0)
    ranges = smooth_sphere_field(rng, lat_deg, lon_deg, 6, (0.08, 0.18))
    height = lsm * (1500.0 * inland**0.7 + 2500.0 * ranges / max(ranges.max(), 1e-12) * inland**0.3 + 50.0)
    return lsm, GRAVITY * height
