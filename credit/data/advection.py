"""Semi-Lagrangian advection and grid-scale diffusion of the toy atmosphere (`credit.data.physics`).

Departure points of the hourly flow, their bilinear interpolation plan (gather indices and
weights for a batch of steps), the interpolation itself and a 5-point diffusion, with the
buffers they fill in place. Hand-written in numpy for speed under the generator's rule: every
value is bitwise what the plain formulas in the docstrings give (see `credit.data.physics`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .constants import EARTH_RADIUS

_RAD2DEG = 180.0 / np.pi  # np.rad2deg(x) is defined as x * (180 / pi); the multiply is much faster


@dataclass
class SphereGrid:
    """The regular (lat, lon) grid of `levels` levels, with the full (L, H, W) factors the
    departure points need (numpy loops much faster over whole arrays than over rows)."""

    lat: np.ndarray  # degrees
    lon: np.ndarray
    lam: np.ndarray  # longitude [rad], (L, H, W)
    phi: np.ndarray  # latitude [rad], (L, H, W)
    earth_cos: np.ndarray  # a max(cos phi, cos 89 deg), (L, H, W)
    level_base: np.ndarray  # flat offset of each level, (L, 1, 1)

    @classmethod
    def build(cls, lat: np.ndarray, lon: np.ndarray, levels: int) -> SphereGrid:
        phi = np.deg2rad(lat)[:, None]
        full = (levels, len(lat), len(lon))
        return cls(lat=lat, lon=lon,
                   lam=np.broadcast_to(np.deg2rad(lon)[None, :], full).copy(),
                   phi=np.broadcast_to(phi, full).copy(),
                   earth_cos=np.broadcast_to(EARTH_RADIUS * np.maximum(np.cos(phi), np.cos(np.deg2rad(89.0))),
                                             full).copy(),
                   level_base=np.arange(levels, dtype=float)[:, None, None] * (len(lat) * len(lon)))


def departure_indices(grid: SphereGrid, u: np.ndarray, v: np.ndarray, dt: float, masks: tuple[np.ndarray, np.ndarray]):
    """Fractional (lat, lon) grid indices of the semi-Lagrangian departure points::

        lam_d = rad2deg(lambda - u dt / (a max(cos phi, cos 89 deg)))  # u vanishes at the poles
        phi_d = rad2deg(phi - v dt / a)
        i = clip((phi_d - lat[0]) / dlat, 0, H - 1),  j = mod((lam_d - lon[0]) / dlon, W)

    Computed in place: ``u`` becomes ``j`` and ``v`` becomes ``i``; ``masks`` are boolean scratch.
    """
    lam_d = np.multiply(np.subtract(grid.lam, np.divide(np.multiply(u, dt, out=u), grid.earth_cos, out=u),
                                    out=u), _RAD2DEG, out=u)
    phi_d = np.multiply(np.subtract(grid.phi, np.divide(np.multiply(v, dt, out=v), EARTH_RADIUS, out=v),
                                    out=v), _RAD2DEG, out=v)
    dlat, dlon = grid.lat[1] - grid.lat[0], grid.lon[1] - grid.lon[0]
    i = np.divide(np.subtract(phi_d, grid.lat[0], out=phi_d), dlat, out=phi_d)
    np.clip(i, 0.0, len(grid.lat) - 1.0, out=i)
    j = np.divide(np.subtract(lam_d, grid.lon[0], out=lam_d), dlon, out=lam_d)
    return i, remainder_inplace(j, len(grid.lon), *masks)


def interpolation_plan(grid: SphereGrid, i: np.ndarray, j: np.ndarray, batch: Forcing) -> None:
    """Fill the batch's gather indices and weights for bilinear interpolation at (T, L, H, W) points.

    Corners are ordered (i0, j0), (i0+1, j0), (i0, j1), (i0+1, j1); ``w_row`` holds 1 - wi and wi,
    ``w_col`` 1 - wj and wj (periodic in longitude). Corner indices are handled as integer-valued
    floats (exact) and cast once. ``i`` is overwritten.
    """
    n, n_lat, n_lon = len(i), len(grid.lat), len(grid.lon)
    w_row, w_col, idx, mask = batch.w_row[:n], batch.w_col[:n], batch.idx[:n], batch.mask[:n]
    i0 = np.minimum(np.floor(i, out=batch.tmp[:n]), n_lat - 2, out=batch.tmp[:n])
    np.subtract(1, np.subtract(i, i0, out=w_row[:, 1]), out=w_row[:, 0])
    j0 = np.floor(j, out=i)
    np.subtract(1, np.subtract(j, j0, out=w_col[:, 1]), out=w_col[:, 0])
    # np.mod can round up to exactly n_lon; that point sits on column 0.
    np.subtract(j0, n_lon, out=j0, where=np.greater_equal(j0, n_lon, out=mask))
    idx[:, 0] = np.add(np.add(np.multiply(i0, n_lon, out=i0), j0, out=i0), grid.level_base, out=i0)
    np.add(idx[:, 0], n_lon, out=idx[:, 1])
    np.add(idx[:, 0], 1, out=idx[:, 2])
    np.subtract(idx[:, 2], n_lon, out=idx[:, 2], where=np.equal(j0, n_lon - 1, out=mask))  # j1 wraps to 0
    np.add(idx[:, 2], n_lon, out=idx[:, 3])


def interpolate(tq: np.ndarray, batch: Forcing, k: int, work: Workspace) -> None:
    """Bilinear interpolation of both fields of ``tq`` at the departure points of step ``k`` into ``work.tq``.

    Per point: (1 - wi) * ((1 - wj) * f00 + wj * f01) + wi * ((1 - wj) * f10 + wj * f11).
    """
    corners = work.corners  # (2 fields, 4 corners, N)
    # mode="wrap" only skips the bounds check: every index is in range by construction.
    np.take(tq.reshape(2, -1), batch.idx[k].reshape(4, -1), axis=1, out=corners, mode="wrap")
    w_row, w_col = batch.w_row[k].reshape(2, -1), batch.w_col[k].reshape(2, -1)
    left, right = corners[:, :2], corners[:, 2:]  # j0 and j1 corners, each for rows i0 and i0 + 1
    np.multiply(w_col[0], left, out=left)
    np.multiply(w_col[1], right, out=right)
    np.add(left, right, out=left)
    np.multiply(w_row, left, out=left)
    np.add(left[:, 0], left[:, 1], out=work.tq.reshape(2, -1))


class Workspace:
    """Scratch arrays of the per-step state update, allocated once and reused by every step."""

    def __init__(self, tq_shape: tuple[int, ...]):
        n_fields, shape = tq_shape[0], tq_shape[1:]
        self.tq = np.empty(tq_shape)
        self.lap = np.empty(tq_shape)
        self.edge = np.empty(tq_shape[:-1])
        self.corners = np.empty((n_fields, 4, int(np.prod(shape))))
        self.tmp, self.q_sat, self.source = np.empty(shape), np.empty(shape), np.empty(shape)


class Forcing:
    """State-independent forcing of up to ``size`` steps (leading axis), filled batch after batch.

    Kept allocated on purpose: fresh arrays of this size come from mmap and cost a page fault per
    4 KiB on first touch, which showed up as a large share of the run time.
    """

    BYTES_PER_POINT = 4 * 8 + 2 + 4 * 8 + 4 * 8  # per step and grid point: the arrays below

    def __init__(self, size: int, shape: tuple[int, int, int]):
        n_lev, n_lat, n_lon = shape
        self.size = size
        self.n = 0  # steps filled
        self.u, self.v, self.tmp, self.heating = np.empty((4, size, *shape))  # u, v, tmp: scratch
        self.mask, self.mask2 = np.empty((2, size, *shape), bool)
        self.idx = np.empty((size, 4, *shape), np.intp)  # flat gather index of each corner
        self.w_row, self.w_col = np.empty((2, size, 2, *shape))
        self.t_eq = np.empty((size, n_lev, n_lat, 1))
        self.skin = np.empty((size, n_lat, n_lon))


def remainder_inplace(x: np.ndarray, n: int, mask: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """``np.mod(x, n, out=x)`` for ``n > 0``, touching only the elements outside (0, n).

    Inside that interval np.mod returns x itself, and np.mod on floats is slow (fmod per element),
    so only the few departure points that cross the date line go through it. ``mask`` and
    ``scratch`` are boolean arrays shaped like ``x``.
    """
    inside = np.logical_and(np.greater(x, 0.0, out=mask), np.less(x, n, out=scratch), out=mask)
    outside = np.logical_not(inside, out=mask)
    x[outside] = np.mod(x[outside], n)
    return x


def diffuse(f: np.ndarray, nu: float, lap: np.ndarray, out: np.ndarray, edge: np.ndarray) -> np.ndarray:
    """Grid-scale diffusion ``out = f + nu * lap`` of a 5-point Laplacian in index space on the last two axes.

    Periodic in longitude, no-flux in latitude (an edge row is its own outer neighbour). The sum is
    accumulated as north + south + west + east - 4 f, the order of the np.roll formulation. Each
    neighbour is added with one shifted add over the flattened arrays (much faster than strided
    slices); the rows and columns where that shift crosses a row or block boundary are then
    overwritten with the correct sums. ``edge`` is scratch shaped like ``f[..., 0]``.
    """
    flat_f, flat_lap, n_lon = f.reshape(-1), lap.reshape(-1), f.shape[-1]
    np.add(flat_f[:-2 * n_lon], flat_f[2 * n_lon:], out=flat_lap[n_lon:-n_lon])  # interior rows
    np.add(f[..., 0, :], f[..., 1, :], out=lap[..., 0, :])  # first and last rows of every block
    np.add(f[..., -2, :], f[..., -1, :], out=lap[..., -1, :])
    np.add(lap[..., 0], f[..., -1], out=edge)  # west neighbour, np.roll(f, 1, -1); column 0 wraps
    np.add(flat_lap[1:], flat_f[:-1], out=flat_lap[1:])
    lap[..., 0] = edge
    np.add(lap[..., -1], f[..., 0], out=edge)  # east neighbour, np.roll(f, -1, -1); last column wraps
    np.add(flat_lap[:-1], flat_f[1:], out=flat_lap[:-1])
    lap[..., -1] = edge
    np.subtract(lap, np.multiply(4.0, f, out=out), out=lap)
    return np.add(f, np.multiply(nu, lap, out=lap), out=out)
