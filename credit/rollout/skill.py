"""Latitude-weighted RMSE and anomaly correlation per channel and lead, for the model, for
persistence (the state at the init time) and for the climatology, against the truth.

For one init time, lead and channel, with w the cos-latitude weights (mean 1), forecast f,
truth o and climatology c:
  MSE = mean(w (f - o)^2)                 RMSE = sqrt(mean of MSE over init times)
  ACC = sum(w f'o') / sqrt(sum(w f'^2) sum(w o'^2)),  f' = f - c, o' = o - c,
averaged over init times. The climatology's own ACC is undefined (f' = 0) and left empty,
as is persistence for diagnostic channels (they are not model inputs).

An ensemble (m members x_1..x_m) is scored by its mean (the model's RMSE and ACC), by the
fair CRPS, mean(w (mean_i |x_i - o| - sum_i (2i - m - 1) x_(i) / (m (m - 1)))) over the
members sorted, averaged over init times, by its spread, sqrt(mean over init times of
mean(w var_i x_i)) with the unbiased variance, and by the spread-skill ratio
sqrt((m + 1) / m) x spread / RMSE of the mean (1 for a reliable ensemble: Fortin et al. 2014).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from credit.data import latitude_weights

FORECASTS = ("model", "persistence", "climatology")
COLUMNS = ["lead_step", "lead_hours", "variable", "level", "channel", "units",
           *(f"rmse_{f}" for f in FORECASTS), *(f"acc_{f}" for f in FORECASTS), "crps", "spread", "spread_skill",
           "n_init"]


class SkillAccumulator:
    """Sums of squared errors and ACCs over init times, per (lead, channel)."""

    def __init__(self, *, channels: Sequence[str], variables: Sequence[str],
                 levels: Sequence[float | None], units: Sequence[str], state_channels: int,
                 latitude: np.ndarray, climatology: np.ndarray, lead_steps: int,
                 step_hours: float) -> None:
        self.channels, self.variables = list(channels), list(variables)
        self.levels, self.units = list(levels), list(units)
        self.state_channels = state_channels
        self.weights = latitude_weights(latitude).double().numpy()[:, None]  # (H, 1)
        self.climatology = climatology
        self.step_hours = step_hours
        shape = (len(FORECASTS), lead_steps, len(channels))
        self.mse = np.zeros(shape)
        self.acc = np.zeros(shape)
        self.count = np.zeros(lead_steps, dtype=np.int64)
        self.members = 1
        self.crps = np.zeros((lead_steps, len(channels)))
        self.variance = np.zeros((lead_steps, len(channels)))

    def _scores(self, forecast: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per channel MSE and ACC of (C, H, W) physical fields."""
        w = self.weights
        mse = (w * (forecast - truth) ** 2).mean(axis=(1, 2))
        fa, oa = forecast - self.climatology[: len(forecast)], truth - self.climatology[: len(truth)]
        num = (w * fa * oa).sum(axis=(1, 2))
        den = np.sqrt((w * fa**2).sum(axis=(1, 2)) * (w * oa**2).sum(axis=(1, 2)))
        with np.errstate(invalid="ignore", divide="ignore"):
            acc = np.where(den > 0, num / den, np.nan)
        return mse, acc

    def add(self, lead: int, forecast: np.ndarray, truth: np.ndarray, persistence: np.ndarray) -> None:
        """Score lead `lead` (0-based) of one init time: (C, H, W) forecast and truth and
        (C_state, H, W) persistence, all float64 in physical units."""
        for i, field in enumerate((forecast, persistence, self.climatology)):
            mse, acc = self._scores(field, truth[: len(field)])
            self.mse[i, lead, : len(field)] += mse
            self.acc[i, lead, : len(field)] += acc
        self.count[lead] += 1

    def add_members(self, lead: int, members: np.ndarray, truth: np.ndarray) -> None:
        """An ensemble's fair CRPS and spread at lead `lead`: (m, C, H, W) members and (C, H, W)
        truth (call `add` with their mean as well)."""
        m = members.shape[0]
        self.members = m
        w = self.weights
        ordered = np.sort(members, axis=0)
        rank = np.arange(1, m + 1, dtype=np.float64).reshape(-1, 1, 1, 1)
        crps = np.abs(members - truth).mean(axis=0) - ((2 * rank - m - 1) * ordered).sum(axis=0) / (m * (m - 1))
        self.crps[lead] += (w * crps).mean(axis=(1, 2))
        self.variance[lead] += (w * members.var(axis=0, ddof=1)).mean(axis=(1, 2))

    def rows(self) -> list[dict[str, object]]:
        """One row per (lead, channel) with every COLUMNS entry ("" where undefined)."""
        rows = []
        for lead in range(len(self.count)):
            n = int(self.count[lead])
            if n == 0:
                continue
            for c, channel in enumerate(self.channels):
                row: dict[str, object] = {
                    "lead_step": lead + 1, "lead_hours": (lead + 1) * self.step_hours,
                    "variable": self.variables[c], "level": "" if self.levels[c] is None else self.levels[c],
                    "channel": channel, "units": self.units[c], "n_init": n}
                for i, name in enumerate(FORECASTS):
                    defined = name != "persistence" or c < self.state_channels
                    row[f"rmse_{name}"] = math.sqrt(self.mse[i, lead, c] / n) if defined else ""
                    acc = self.acc[i, lead, c] / n
                    row[f"acc_{name}"] = acc if defined and name != "climatology" and np.isfinite(acc) else ""
                ensemble = self.members > 1
                spread = math.sqrt(self.variance[lead, c] / n)
                rmse = row["rmse_model"]
                row["crps"] = self.crps[lead, c] / n if ensemble else ""
                row["spread"] = spread if ensemble else ""
                row["spread_skill"] = (math.sqrt((self.members + 1) / self.members) * spread / rmse
                                       if ensemble and rmse else "")
                rows.append(row)
        return rows


def write_skill_csv(rows: list[dict[str, object]], path: Path) -> None:
    """skill.csv: COLUMNS, full-precision floats."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: repr(float(v)) if isinstance(v, float) else v for k, v in row.items()})


def read_skill_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))
