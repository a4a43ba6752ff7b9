"""CREDIT's gen2 `tisr` source: the top-of-atmosphere incident solar radiation ERA5 calls
`toa_incident_solar_radiation` (J m-2), computed for each time instead of read from a file.

At a time `t`, the instantaneous irradiance `TSI(t) (1 AU / r(t))^2 max(0, cos zenith)` is
integrated with the trapezoidal rule over the `steps` equal intervals of `(t - period, t]`
(`period` is the data's time step, as CREDIT's dataset takes it). The orbit is the IFS's
low-order one (declination, equation of time and Earth-Sun distance from the days since
J2000), the total solar irradiance TSI is interpolated linearly in the fractional year between
the annual means of a table (CREDIT reads ECMWF's CMIP6 table from its own package). The
arithmetic is CREDIT's: the same torch float32 operations in the same order, so the values
equal those of CREDIT's `TISRDataset` (`tests/data/test_credit_tisr.py`, fixture made with
CREDIT's code by `tests/fixtures/credit_tisr/make.py`).

Hand-written rather than taken from a solar-geometry library: CREDIT's values are the contract,
and their float32 rounding (the J2000 day count itself is rounded to float32) is part of them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from credit.data.catalog import LAT_NAMES, LON_NAMES, DataError, open_store
from credit.interop.paths import find_metadata_file

TSI_TABLE = "total_solar_irradiance_CMIP6_49r1.nc"
"""The table CREDIT's `tisr` source reads, in its package's `credit/metadata` folder."""
J2000_JULIAN_DATE = 2451545.0
# the IFS orbit: coefficients of the true ecliptic longitude, equation of time (s) and distance (AU)
_LONGITUDE = (4.8952, 6.283320, -0.0075, -0.0326, -0.0003, 0.0002)
_EQUATION_OF_TIME = (591.8, -459.4, 39.5, -12.7, -4.8)
_DISTANCE = (1.0001, -0.0163, 0.0037)
_OBLIQUITY = 0.409093
_BLOCK_ELEMENTS = 1 << 19  # a block of rows times times: 2 MiB of float32, within a core's cache


def find_tsi_table(config_file: Path) -> Path | None:
    """CREDIT's TSI table in the CREDIT checkout that holds `config_file`, or None."""
    return find_metadata_file(config_file, TSI_TABLE)


def read_tsi_table(path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(fractional mid-year times, TSI in W m-2) of a table in CREDIT's layout, float32."""
    import xarray as xr

    try:
        with xr.open_dataset(path, decode_times=False) as ds:
            times, tsi = np.asarray(ds["time"].values), np.asarray(ds["tsi"].values)
    except (OSError, ValueError, KeyError) as err:
        raise DataError(f"{path}: not a total solar irradiance table (a `tsi` variable on fractional years, "
                        f"CREDIT's {TSI_TABLE}): {err}") from None
    if times.ndim != 1 or len(times) < 2 or not np.all(np.diff(times) > 0):
        raise DataError(f"{path}: its time axis must hold 2 or more increasing fractional years")
    return torch.tensor(times, dtype=torch.float32), torch.tensor(tsi, dtype=torch.float32)


def spec_axis(name: str, spec: Sequence) -> torch.Tensor:
    """CREDIT's `[start, end, num_points]`, both ends included, float32."""
    if not isinstance(spec, (list, tuple)) or len(spec) != 3 or not isinstance(spec[2], int) \
            or isinstance(spec[2], bool) or spec[2] < 1:
        raise DataError(f"{name}: {spec!r}; CREDIT's form is [start, end, num_points], num_points an int >= 1")
    return torch.linspace(float(spec[0]), float(spec[1]), spec[2], dtype=torch.float32)


def grid_from_specs(lat_spec: Sequence, lon_spec: Sequence, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    lat = spec_axis(f"{where}.lat_spec", lat_spec)
    lon = spec_axis(f"{where}.lon_spec", lon_spec)
    lat2, lon2 = torch.meshgrid(lat, lon, indexing="ij")
    return lat2, lon2


def grid_from_file(path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Latitude and longitude (degrees) of a netCDF file: 1-D axes or 2-D fields, float32."""
    with open_store(Path(path), cache=False) as ds:
        names = set(ds.coords) | set(ds.data_vars)
        lat_name = next((n for n in (*LAT_NAMES, "XLAT", "nav_lat") if n in names), None)
        lon_name = next((n for n in (*LON_NAMES, "XLONG", "nav_lon") if n in names), None)
        if lat_name is None or lon_name is None:
            raise DataError(f"{path}: no latitude/longitude to compute tisr on; it holds {sorted(names)}")
        lat = torch.tensor(np.asarray(ds[lat_name].squeeze().values), dtype=torch.float32)
        lon = torch.tensor(np.asarray(ds[lon_name].squeeze().values), dtype=torch.float32)
    if lat.ndim == 1 and lon.ndim == 1:
        return torch.meshgrid(lat, lon, indexing="ij")
    if lat.ndim == 2 and lat.shape == lon.shape:
        return lat, lon
    raise DataError(f"{path}: latitude {tuple(lat.shape)} and longitude {tuple(lon.shape)} are neither two axes "
                    "nor two fields of one grid")


def _irradiance(times: pd.DatetimeIndex, tsi_times: torch.Tensor, tsi: torch.Tensor) -> torch.Tensor:
    """TSI at `times`: linear in the fractional year between the table's annual means."""
    years = times.year.to_numpy()
    if years.min() < int(tsi_times[0]) or years.max() > int(tsi_times[-1]):
        raise DataError(f"tisr at {times[0]} .. {times[-1]}: the total solar irradiance table covers the years "
                        f"{int(tsi_times[0])} to {int(tsi_times[-1])}")
    day_fraction = (times - pd.DatetimeIndex(times.date)) / pd.Timedelta(days=1)
    fraction = (times.day_of_year - 1 + day_fraction) / (365 + times.is_leap_year)
    year = torch.tensor((times.year + fraction).to_numpy(), dtype=tsi_times.dtype)
    upper = torch.searchsorted(tsi_times.contiguous(), year.contiguous()).clamp(1, len(tsi_times) - 1)
    lower = upper - 1
    weight = (year - tsi_times[lower]) / (tsi_times[upper] - tsi_times[lower])
    return tsi[lower] + weight * (tsi[upper] - tsi[lower])


def _dot(features: list[torch.Tensor], coefficients: Sequence[float]) -> torch.Tensor:
    return torch.stack(features, dim=-1) @ torch.tensor(coefficients, dtype=features[0].dtype)


def _orbit(times: pd.DatetimeIndex, tsi_times: torch.Tensor, tsi: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per time, shaped (T, 1, 1): the irradiance at the Earth (TSI x (1 AU / r)^2), the
    declination's cosine and sine, and the Sun's hour angle at longitude 0 in degrees."""
    days = torch.tensor(times.to_julian_date().to_numpy() - J2000_JULIAN_DATE,
                        dtype=torch.float32)[:, None, None]
    theta = days / 365.25  # Julian years since J2000
    phase = days % 1.0  # 0 at 12 UTC
    mean_longitude = 1.7535 + 6.283076 * theta
    anomaly = 6.240041 + 6.283020 * theta
    longitude_eot = 4.8951 + 6.283076 * theta
    one = torch.ones_like(theta)
    sin_l, cos_l = torch.sin(mean_longitude), torch.cos(mean_longitude)
    true_longitude = _dot([one, theta, sin_l, cos_l, torch.sin(2.0 * mean_longitude),
                           torch.cos(2.0 * mean_longitude)], _LONGITUDE)
    sin_declination = torch.sin(torch.tensor(_OBLIQUITY, dtype=days.dtype)) * torch.sin(true_longitude)
    cos_declination = torch.sqrt(1.0 - sin_declination ** 2)
    sin_anomaly = torch.sin(anomaly)
    equation_of_time = _dot([torch.sin(2.0 * longitude_eot), sin_anomaly,
                             sin_anomaly * torch.cos(2.0 * longitude_eot), torch.sin(4.0 * longitude_eot),
                             torch.sin(2.0 * anomaly)], _EQUATION_OF_TIME)
    distance = _dot([one, sin_l, cos_l], _DISTANCE)
    at_earth = _irradiance(times, tsi_times, tsi)[:, None, None] * (1.0 / distance ** 2)
    return at_earth, cos_declination, sin_declination, 360.0 * (phase + equation_of_time / 86400)


def _irradiance_on(orbit: tuple[torch.Tensor, ...], lat: torch.Tensor, cos_hour_angle: torch.Tensor) -> torch.Tensor:
    """The irradiance (W m-2) at each time on the points of `lat` (broadcast against
    `cos_hour_angle`): TSI (1 AU / r)^2 max(0, cos zenith)."""
    at_earth, cos_declination, sin_declination, _ = orbit
    cos_zenith = (torch.cos(torch.deg2rad(lat[None])) * cos_declination * cos_hour_angle
                  + torch.sin(torch.deg2rad(lat[None])) * sin_declination).clamp(min=0)
    return at_earth * cos_zenith.clamp(min=0)


def instantaneous(times: pd.DatetimeIndex, lat: torch.Tensor, lon: torch.Tensor, tsi_times: torch.Tensor,
                  tsi: torch.Tensor) -> torch.Tensor:
    """The irradiance on the grid at each of `times` (W m-2): (len(times), *lat.shape)."""
    orbit = _orbit(times, tsi_times, tsi)
    return _irradiance_on(orbit, lat, torch.cos(torch.deg2rad(orbit[3] + lon[None])))


def integrated(t: pd.Timestamp, period: pd.Timedelta, steps: int, lat: torch.Tensor, lon: torch.Tensor,
               tsi_times: torch.Tensor, tsi: torch.Tensor) -> torch.Tensor:
    """The irradiance integrated over `(t - period, t]` in `steps` trapezoids (J m-2), float32.

    Each element is CREDIT's arithmetic, but not computed as CREDIT lays it out: on a
    rectangular grid the hour angle's cosine is taken once per longitude (an (T, 1, W) row, not
    (T, H, W)), and the grid goes in blocks of rows small enough to stay in the CPU's cache,
    each integrated over all its times: the same float32 sum over time for each point, which
    torch's reduction may group otherwise for another block shape (a few ulp; the same bits as
    one call on the fixture's grids). 1.5 s for a 1-degree field of 2160 steps on one thread
    of the Zen 4 VM, 3.7 s in CREDIT's layout (benchmarks/tisr.py)."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise DataError(f"num_integration_steps: {steps!r}; a positive int")
    times = pd.date_range(end=t, periods=steps + 1, freq=period / steps)
    dx = period / steps / pd.Timedelta(seconds=1)
    orbit = _orbit(times, tsi_times, tsi)
    rectangular = torch.equal(lat, lat[:, :1].expand_as(lat)) and torch.equal(lon, lon[:1].expand_as(lon))
    if not rectangular:  # each point its own hour angle
        cos_hour_angle = torch.cos(torch.deg2rad(orbit[3] + lon[None]))
        return torch.trapz(_irradiance_on(orbit, lat, cos_hour_angle), dx=dx, dim=0)
    cos_hour_angle = torch.cos(torch.deg2rad(orbit[3] + lon[None, :1]))  # (T, 1, W)
    rows = max(2, _BLOCK_ELEMENTS // (len(times) * lat.shape[1]))
    column = lat[:, :1]
    blocks = [torch.trapz(_irradiance_on(orbit, column[r:r + rows], cos_hour_angle), dx=dx, dim=0)
              for r in range(0, lat.shape[0], rows)]
    return torch.cat(blocks)


class SolarSource:
    """A `tisr` source: `__call__(t_ns)` gives its field at a time (float32, the grid's shape),
    computed once per time this process asks for recently (a sample's frames overlap the
    next sample's)."""

    def __init__(self, name: str, variable: str, steps: int, period_ns: int, lat: torch.Tensor,
                 lon: torch.Tensor, tsi_table: str | Path, cached: int = 32) -> None:
        self.name, self.variable, self.steps = name, variable, int(steps)
        self.period = pd.Timedelta(int(period_ns), unit="ns")
        self.lat, self.lon = lat, lon
        self.tsi_times, self.tsi = read_tsi_table(tsi_table)
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._cached = cached

    @property
    def grid_shape(self) -> tuple[int, int]:
        return tuple(self.lat.shape)

    def check_years(self, first_ns: int, last_ns: int) -> None:
        """One error, before any sample, when the times `first_ns` .. `last_ns` (and the
        integration window before the first) fall outside the table's years."""
        times = pd.DatetimeIndex([pd.Timestamp(int(first_ns), unit="ns") - self.period,
                                  pd.Timestamp(int(last_ns), unit="ns")])
        _irradiance(times, self.tsi_times, self.tsi)

    def __call__(self, t_ns: int) -> np.ndarray:
        t_ns = int(t_ns)
        if t_ns in self._cache:
            self._cache.move_to_end(t_ns)
            return self._cache[t_ns]
        value = integrated(pd.Timestamp(t_ns, unit="ns"), self.period, self.steps, self.lat, self.lon,
                           self.tsi_times, self.tsi).numpy()
        self._cache[t_ns] = value
        if len(self._cache) > self._cached:
            self._cache.popitem(last=False)
        return value


def solar_source(section: Mapping[str, Any], timestep: str, root: str | Path) -> SolarSource:
    """The `SolarSource` of `data.credit.tisr` (the data's `timestep` is its integration period;
    a relative grid file or table is under `root`)."""
    where = f"data.source.{section['source']}"
    table = section.get("tsi_table")
    if not table:
        raise DataError(f"{where} (dataset_type: tisr) needs CREDIT's total solar irradiance table, "
                        f"credit/metadata/{TSI_TABLE} of a CREDIT checkout: none is beside the config file; "
                        f"set data.credit.tisr.tsi_table=PATH")
    specs = section.get("lat_spec"), section.get("lon_spec")
    grid_file = section.get("grid_file")
    if (specs[0] is None) != (specs[1] is None) or (grid_file is None) == (specs[0] is None):
        raise DataError(f"{where}: give latlon_grid_path, or lat_spec and lon_spec (CREDIT reads exactly one)")
    if grid_file is None:
        lat, lon = grid_from_specs(list(specs[0]), list(specs[1]), where)
    else:
        lat, lon = grid_from_file(Path(root, grid_file))
    return SolarSource(section["source"], section["variable"], section["integration_steps"],
                       pd.Timedelta(timestep).value, lat, lon, Path(root, table))
