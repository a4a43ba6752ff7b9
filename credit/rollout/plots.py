"""Figures of a rollout: RMSE against lead time (an ensemble's spread and CRPS too), and one
forecast/truth/difference map."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

_STYLES = {"model": ("C0", "-"), "persistence": ("C1", "--"), "climatology": ("C2", ":")}


def plot_rmse_vs_lead(rows: Sequence[dict[str, object]], path: Path) -> None:
    """One panel per channel: RMSE of model, persistence and climatology against lead hours."""
    series = {name: (f"rmse_{name}", color, style) for name, (color, style) in _STYLES.items()}
    _panels(rows, series, "latitude-weighted RMSE", path)


def plot_spread_skill(rows: Sequence[dict[str, object]], path: Path) -> None:
    """An ensemble's panels: the RMSE of its mean, its spread and its CRPS against lead hours
    (spread near RMSE: a reliable ensemble; skill.csv's spread_skill is their ratio)."""
    series = {"RMSE of the mean": ("rmse_model", "C0", "-"), "spread": ("spread", "C3", "--"),
              "CRPS": ("crps", "C4", ":")}
    _panels(rows, series, "ensemble: latitude-weighted RMSE of the mean, spread and CRPS", path)


MAX_PANELS = 32
"""Beyond this many channels, an upper-air variable is drawn at three of its levels."""


def shown_channels(rows: Sequence[dict[str, object]], limit: int = MAX_PANELS) -> tuple[list[str], str]:
    """The channels the figures draw, and a note for the title when some are left out. Every
    channel up to `limit`; beyond it (CREDIT's files hold 16 to 137 levels a variable: hundreds
    of panels, minutes of drawing), each upper-air variable at its first, middle and last level,
    every single-level channel still drawn. skill.csv keeps every channel."""
    channels = list(dict.fromkeys(str(r["channel"]) for r in rows))
    if len(channels) <= limit:
        return channels, ""
    by_variable: dict[str, dict[str, None]] = {}  # each upper-air variable's channels, in order
    for row in rows:
        if str(row.get("level", "")) != "":
            by_variable.setdefault(str(row["variable"]), {})[str(row["channel"])] = None
    kept = set()
    for names in map(list, by_variable.values()):
        kept.update(names[i] for i in {0, len(names) // 2, len(names) - 1})
    multi = {c for names in by_variable.values() for c in names}
    shown = [c for c in channels if c in kept or c not in multi]
    return shown, f" (3 levels of each upper-air variable; skill.csv has all {len(channels)} channels)"


def _panels(rows: Sequence[dict[str, object]], series: dict[str, tuple[str, str, str]], title: str,
            path: Path) -> None:
    """One panel per shown channel (`shown_channels`), each `series` label's column (color, line
    style) against lead hours."""
    channels, note = shown_channels(rows)
    title += note
    cols = min(4, len(channels))
    nrows = math.ceil(len(channels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols, 2.6 * nrows), squeeze=False)
    for ax, channel in zip(axes.flat, channels):
        mine = [r for r in rows if r["channel"] == channel]
        hours = [float(r["lead_hours"]) for r in mine]
        for label, (column, color, style) in series.items():
            values = [float(r[column]) if r[column] != "" else np.nan for r in mine]
            if not all(np.isnan(values)):
                ax.plot(hours, values, style, color=color, marker=".", label=label)
        units = mine[0]["units"]
        ax.set_title(f"{channel} [{units}]" if units else channel, fontsize=9)
        ax.set_xlabel("lead time (h)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.yaxis.get_offset_text().set_fontsize(7)
    for ax in list(axes.flat)[len(channels):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_map(forecast: np.ndarray, truth: np.ndarray, latitude: np.ndarray, longitude: np.ndarray,
             title: str, units: str, path: Path) -> None:
    """Forecast, truth (shared colour scale) and forecast - truth of one (H, W) field."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    low, high = float(min(forecast.min(), truth.min())), float(max(forecast.max(), truth.max()))
    diff = forecast - truth
    span = float(np.abs(diff).max()) or 1.0
    panels = ((forecast, "forecast", "viridis", low, high), (truth, "truth", "viridis", low, high),
              (diff, "forecast - truth", "RdBu_r", -span, span))
    for ax, (field, name, cmap, vmin, vmax) in zip(axes, panels):
        mesh = ax.pcolormesh(longitude, latitude, field, cmap=cmap, vmin=vmin, vmax=vmax, shading="auto")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("longitude (°E)")
        fig.colorbar(mesh, ax=ax, label=units)
    axes[0].set_ylabel("latitude (°N)")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
