"""What `credit plan` builds and feeds without reading data: the model's data layout and the
shapes of a training batch, from the config alone.

The grid and channel counts come from the model's keys where they are set (a CREDIT config
sets them all), else from `data.*` (variables, levels, history) and the grid given to the
command. The batch is laid out as `credit.data.dataset` delivers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from credit.config import ConfigError
from credit.data.from_config import layout_from_counts


@dataclass(frozen=True)
class SampleShapes:
    """Channel counts of one sample and its grid; `layout()` is what `build_model` takes."""

    upper_air: int
    levels: int
    surface: int
    forcing: int
    static: int
    diagnostic: int
    history_len: int
    forecast_len: int
    grid: tuple[int, int]

    @property
    def state_channels(self) -> int:
        return self.upper_air * self.levels + self.surface

    def layout(self) -> dict[str, Any]:
        return layout_from_counts(upper_air=self.upper_air, levels=self.levels, surface=self.surface,
                                  forcing=self.forcing, static=self.static, diagnostic=self.diagnostic,
                                  history_len=self.history_len, grid=self.grid)

    def batch(self, samples: int) -> dict[str, tuple[int, ...]]:
        """The shapes of a batch of `samples` as the loader delivers it."""
        h, f, grid = self.history_len, self.forecast_len, self.grid
        return {
            "state": (samples, h, self.state_channels, *grid),
            "forcing": (samples, h + f, self.forcing, *grid),
            "static": (samples, self.static, *grid),
            "target": (samples, f, self.state_channels + self.diagnostic, *grid),
        }


def _model_key(model: DictConfig, key: str) -> int | None:
    value = model.get(key)
    return None if value is None else int(value)


def sample_shapes(cfg: DictConfig, grid: tuple[int, int] | None = None) -> SampleShapes:
    """The sample of `cfg` on `grid` (NLAT, NLON), or on the grid of `model.image_height`
    and `model.image_width`; ConfigError when neither gives one or they disagree."""
    model, data = cfg.model, cfg.data
    v = data.variables
    keys = (_model_key(model, "image_height"), _model_key(model, "image_width"))
    if grid is None and None in keys:
        raise ConfigError("credit plan reads no data, so it needs the grid: pass --grid NLATxNLON "
                          "or set model.image_height and model.image_width")
    if grid is not None and None not in keys and tuple(grid) != keys:
        raise ConfigError(f"--grid {grid[0]}x{grid[1]} differs from model.image_height x "
                          f"model.image_width = {keys[0]}x{keys[1]}; give one of them")
    input_only = _model_key(model, "input_only_channels")
    forcing, static = len(v.forcing), len(v.static)
    if input_only is not None and input_only != forcing + static:
        forcing, static = input_only, 0  # the split is unknown: all as forcing, the larger in a batch
    counts = {
        "upper_air": (_model_key(model, "channels"), len(v.upper_air)),
        "levels": (_model_key(model, "levels"), len(data.levels)),
        "surface": (_model_key(model, "surface_channels"), len(v.surface)),
        "diagnostic": (_model_key(model, "output_only_channels"), len(v.diagnostic)),
        "history_len": (_model_key(model, "frames"), int(data.history_len)),
    }
    values = {key: data_value if key_value is None else key_value for key, (key_value, data_value) in counts.items()}
    return SampleShapes(**values, forcing=forcing, static=static, forecast_len=int(data.forecast_len),
                        grid=tuple(grid) if grid is not None else keys)
