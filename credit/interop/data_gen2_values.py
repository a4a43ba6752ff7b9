"""What a variable's values go through in CREDIT's gen2 data (`CreditGen2Dataset` takes this
mixin): the pointwise preblocks (log, sqrt, fill_values: credit/interop/pointwise_blocks.py),
then the normaliser, either the era5_normalizer's mean and std files or a bridgescaler file's
scalers (credit/interop/bridgescaler_file.py); and, for the outputs, the statistics and
pointwise inverses that bring forecasts and physical-unit losses back to the data's units.

The mixin reads the dataset's `root`, `names`, `level_values`, `level_coord`, `grid_shape`,
`spatial`, `_transforms` and `_inverse_entries`, set before it is used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from credit.data.catalog import DataError, open_store
from credit.data.statistics_files import first_unusable
from credit.interop.layout import iso, warn_once
from credit.interop.path_templates import template_files
from credit.interop.pointwise_blocks import OutputInverse

STD_FLOOR = np.float32(1e-12)


def f32(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


class Gen2Values:
    """The pointwise preblocks and the normaliser of a gen2 dataset's variables, and the
    statistics and inverses of its outputs."""

    def _load_statistics(self, files: Mapping[str, str | None], stats_levels: Sequence[int] | None) -> None:
        self._mean: dict[str, np.ndarray] = {}
        self._std: dict[str, np.ndarray] = {}
        paths = []
        for role in ("mean", "std"):
            found = template_files(self.root, files[role]) if files.get(role) else []
            if len(found) != 1:
                raise DataError(f"the normaliser's {role}_path {files.get(role)!r} must name one file; it matches "
                                f"{len(found)}")
            paths.append(found[0][0])
        mean_ds, std_ds = (open_store(p, cache=False) for p in paths)
        try:
            for var in [v for names in self.names.values() for v in names]:
                if var not in mean_ds.data_vars or var not in std_ds.data_vars:
                    continue  # CREDIT's normaliser passes it through as stored
                stats = []
                for path, ds in zip(paths, (mean_ds, std_ds)):
                    values = f32(ds[var].values)
                    rows = list(range(values.shape[0])) if values.ndim == 1 else []
                    if values.ndim == 1 and values.shape[0] > 1 and stats_levels:
                        rows = [int(p) - 1 for p in stats_levels]
                        if min(rows) < 0 or max(rows) >= values.shape[0]:
                            raise DataError(f"the normaliser's levels {list(stats_levels)} (1-indexed positions) "
                                            f"fall outside {path}'s {values.shape[0]} levels of {var}")
                        values = values[rows]
                    self._check_stat_levels(path, ds[var], rows)
                    where = first_unusable(values, path == paths[1])
                    if where is not None and var not in self.names["static"]:  # a constant static is CREDIT's 0
                        raise DataError(f"{path}: the {'std' if path == paths[1] else 'mean'} of {var!r} is "
                                        f"{float(np.atleast_1d(values)[where])} (position {where}); it must be finite"
                                        + " and > 0: CREDIT divides by max(std, 1e-12), and the normalised values "
                                          "would overflow the loss" * (path == paths[1]))
                    if var in self.names["upper_air"] and values.ndim == 1 and values.shape[0] > 1:
                        if values.shape[0] != len(self.level_values):
                            raise DataError(f"{path}: {var} has {values.shape[0]} levels, the data "
                                            f"{len(self.level_values)}; CREDIT matches them by position (give the "
                                            "normaliser's `levels`)")
                        values = values.reshape(-1, 1, 1)
                    elif values.ndim == 1 and values.shape[0] > 1:
                        raise DataError(f"{path}: {var} has {values.shape[0]} values on an axis; a 2-D variable's "
                                        "statistics are one number or one per grid point")
                    stats.append(values)
                self._mean[var], self._std[var] = stats[0], np.maximum(stats[1], STD_FLOOR)
        finally:
            mean_ds.close()
            std_ds.close()

    def _scaler_variance(self, file: str, key: str) -> float:
        """The variance of `key`'s target scaler in the bridgescaler file (NaN: none there)."""
        from credit.interop.bridgescaler_file import scaler_variance

        found = template_files(self.root, file)
        return scaler_variance(found[0][0] if found else self.root / file, "target", key)

    def _load_bridgescaler(self, file: str, source_name: str, scaled: Sequence[str] | None,
                           sides: Sequence[str]) -> tuple[dict[str, np.ndarray], ...]:
        """(mean, std) tables of each of `sides` ("input", "target") from the bridgescaler file."""
        from credit.interop.bridgescaler_file import data_statistics

        found = template_files(self.root, file)
        if len(found) > 1:
            raise DataError(f"the bridgescaler file {file!r} must name one file; it matches {len(found)}")
        path = found[0][0] if found else self.root / file  # data_statistics says it does not exist
        levels = len(self.level_values) if self.level_values is not None else 0
        other = {self.solar.variable: self.solar.name} if self.solar is not None else None
        return tuple(table for side in sides
                     for table in data_statistics(path, side, self.names, source_name, scaled, levels,
                                                  self.spatial, tuple(self.grid_shape), other))

    def _check_stat_levels(self, path: Path, stat, rows: list[int]) -> None:
        """CREDIT matches statistics to levels by position; say so when their own level
        coordinate, read at those positions, names other levels than the data's."""
        coord = next((c for c in (self.level_coord, "level") if c in stat.coords), None)
        if coord is None or self.level_values is None or len(rows) != len(self.level_values):
            return
        levels = np.asarray(stat[coord].values, dtype=np.float64)[rows]
        if not np.array_equal(levels, self.level_values):
            warn_once(f"{path.name}: the statistics at the data's level positions are for levels {levels.tolist()}, "
                       f"the data are on {self.level_values.tolist()}; CREDIT's normaliser matches them by "
                       "position (its `levels`), and so does this run")

    def _normalized(self, var: str, values: np.ndarray, target: bool = False) -> np.ndarray:
        values = f32(values)
        mean, std = (self._target_mean, self._target_std) if target else (self._mean, self._std)
        if var not in mean:
            return values
        return (values - mean[var]) / std[var]

    def _field(self, role: str, var: str, t: int, target: bool = False) -> np.ndarray:
        path = self._file_at(role, t)
        row = self._row(path, t)
        self.check_stored(path, var, [row], np.array([t]))
        da = self._store(path)[var].isel(time=row)
        upper = var in self.names["upper_air"]
        if upper:
            da = da.transpose(self.level_coord, ...).isel({self.level_coord: self._level_rows})
        values = self._transformed(var, np.asarray(da.values), path, t)  # fill_values may fill NaN
        values = self.check_finite(values[None], var, path, np.array([t]), self.level_values if upper else None)[0]
        return self._normalized(var, values, target)

    def _transformed(self, var: str, values: np.ndarray, path: Path, t: int | None) -> np.ndarray:
        """`values` through the pointwise preblocks that name `var`, in order (float32, torch's
        arithmetic as CREDIT's); a finite value they leave non-finite is one error naming the
        block that made it so (a value stored non-finite is the caller's finite check's)."""
        chain = [block for block, names in self._transforms if var in names]
        if not chain:
            return values
        steps = [torch.from_numpy(f32(values))]
        for block in chain:
            steps.append(block(steps[-1]))
        made = torch.nonzero(~torch.isfinite(steps[-1]) & torch.isfinite(steps[0]))
        if len(made):
            where = tuple(int(i) for i in made[0])
            i = next(i for i in range(len(chain)) if not torch.isfinite(steps[i + 1][where]))
            kind, when = chain[i].kind, "" if t is None else f" at {iso(t)}"
            raise DataError(f"{path}: {kind}_transform of {var!r}{when} gives {float(steps[i + 1][where])} from "
                            f"{float(steps[i][where])} (index {where}); CREDIT's {kind} needs values "
                            + ("> -eps" if kind == "log" else ">= 0"))
        return steps[-1].numpy()

    def _stat(self, table: dict[str, np.ndarray], missing: float) -> np.ndarray:
        """(C,) per output channel, or (C, lat, lon) when a channel's statistics are per grid point."""
        values = []
        for v in self.names["upper_air"]:
            stat = table.get(v, np.full(1, missing, np.float32)).reshape(-1, 1, 1)
            values.append(np.broadcast_to(stat, (len(self.levels), 1, 1)) if stat.size == 1 else stat)
        for v in self.names["surface"] + self.names["diagnostic"]:
            stat = np.asarray(table.get(v, np.full(1, missing, np.float32)))
            values.append(stat.reshape(1, *stat.shape) if stat.ndim == 2 else stat.reshape(1, 1, 1))
        if all(v.shape[1:] == (1, 1) for v in values):
            return np.concatenate(values).reshape(-1).astype(np.float64)
        return np.concatenate([np.broadcast_to(v, (len(v), *self.grid_shape)) for v in values]).astype(np.float64)

    @property
    def target_mean(self) -> np.ndarray:
        """What de-normalises the outputs (forecasts, physical-unit losses): the normaliser's, or
        the target scalers of the bridgescaler file the inverse postblocks name; per channel, or
        per channel and grid point (credit/data/target_statistics.py)."""
        return self._stat(self._output_mean, 0.0)

    @property
    def target_std(self) -> np.ndarray:
        return self._stat(self._output_std, 1.0)

    @property
    def output_inverse(self) -> OutputInverse | None:
        """The postblocks' pointwise inverses on the de-normalised target channels (None: none)."""
        names = self.variable_of_channel
        inverse = OutputInverse(self._inverse_entries, [names[c] for c in self.target_channel_names])
        return inverse if inverse else None
