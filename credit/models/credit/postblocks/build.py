"""The post blocks of a CREDIT config file (`from_credit`) and of a run's config (`credit
train`, `credit rollout`): one builder, two sources of the channels and the physics file.

A CREDIT config names its channels, statistics and physics file in its `data:` section,
gen1 (CREDIT's parser rules) or gen2 (`data.source.ERA5` and the normaliser's files, as
CREDIT's gen2 rollout reads them; `settings`); a run names them in `data.*`: the output channels of
`data.variables` and `data.levels`, the dataset's mean and std, `data.physics_file`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from credit.models.credit.postblocks.fixers import (Fixer, GlobalEnergyFixer, GlobalMassFixer, GlobalWaterFixer,
                                             OutsidePostBlocks, PostBlocks, TracerFixer)
from credit.models.credit.postblocks.settings import (ChannelLayout, PostBlockConfigError, active_fixers, channel_layout,
                                               channel_layout_gen2, column_physics, physics_field, resolve_path)


@dataclass
class RunPostBlocks:
    """The fixers inside the model's forward and those after it (either may be None)."""

    inside: PostBlocks | None
    outside: OutsidePostBlocks | None

    def attach(self, model: nn.Module) -> nn.Module:
        """Give `model` (a CREDIT CrossFormer) its post blocks: `post_blocks` runs at the end
        of its forward, `outside_post_blocks` in `credit.models.inputs.predict`."""
        if self.inside is not None:
            model.post_blocks = self.inside
        if self.outside is not None:
            model.outside_post_blocks = self.outside
        return model


def build_fixers(post_conf: Mapping[str, Any], layout: ChannelLayout, physics_path: Path | None, physics_key: str,
                 seconds: int, deterministic: bool = False) -> RunPostBlocks:
    """The active fixers of `post_conf` on `layout`'s channels; the conservation fixers read
    their grid from `physics_path` (named `physics_key` in errors)."""
    inside, outside = active_fixers(post_conf)
    if not inside and not outside:
        return RunPostBlocks(None, None)
    physics = None
    if any(name != "tracer_fixer" for name in inside + outside):
        if physics_path is None:
            raise PostBlockConfigError(f"{physics_key} is needed by the conservation post blocks and is not set")
        physics = column_physics(post_conf, physics_path, physics_key, deterministic)
    built: dict[str, Fixer] = {}
    for name in inside + outside:
        conf = post_conf[name]
        try:
            if name == "tracer_fixer":
                built[name] = TracerFixer(conf, layout)
            elif name == "global_mass_fixer":
                built[name] = GlobalMassFixer(conf, layout, physics, seconds)
            elif name == "global_water_fixer":
                built[name] = GlobalWaterFixer(conf, layout, physics, seconds)
            else:
                names_key = "post_conf.global_energy_fixer.surface_geopotential_name"
                geopotential = physics_field(physics_path, list(conf["surface_geopotential_name"])[0], physics_key,
                                             names_key)
                built[name] = GlobalEnergyFixer(conf, layout, physics, seconds, geopotential)
        except (KeyError, IndexError) as missing:
            key = missing.args[0] if isinstance(missing, KeyError) else "surface_geopotential_name"
            raise PostBlockConfigError(f"post_conf.{name}.{key} is not set") from None
    return RunPostBlocks(PostBlocks([built[n] for n in inside]) if inside else None,
                         OutsidePostBlocks([built[n] for n in outside]) if outside else None)


def build_post_blocks(config: Mapping[str, Any], config_dir: Path) -> RunPostBlocks:
    """CREDIT's post blocks of a whole CREDIT config (its `model.post_conf` and its `data:`
    section). Relative paths are looked for beside the config file, then in the working
    directory."""
    model = config.get("model") or {}
    post_conf = model.get("post_conf")
    inside, outside = active_fixers(post_conf)
    if not inside and not outside:
        return RunPostBlocks(None, None)
    data = config.get("data")
    if not isinstance(data, Mapping):
        raise PostBlockConfigError("post_conf is active but the config has no data: section, which names the "
                                   "channels, statistics and physics file the post blocks need")
    if "source" in data:
        layout = channel_layout_gen2(config, config_dir)
        seconds = int(pd.Timedelta(data["timestep"]).total_seconds()) if data.get("timestep") \
            else int(data.get("lead_time_periods", 6)) * 3600
    else:
        levels = data.get("levels", model.get("levels"))
        if levels is None:
            raise PostBlockConfigError("data.levels (or model.levels) is not set")
        layout = channel_layout(data, int(levels), config_dir)
        seconds = int(data.get("lead_time_periods", 6)) * 3600
    physics_path = None
    if any(name != "tracer_fixer" for name in inside + outside):
        physics_path = resolve_path(data.get("save_loc_physics"), "data.save_loc_physics", config_dir)
    return build_fixers(post_conf, layout, physics_path, "data.save_loc_physics", seconds)


def run_post_blocks(model_cfg: Mapping[str, Any], data_cfg: Mapping[str, Any], dataset: Any) -> RunPostBlocks:
    """The post blocks of a run's `model.post_conf`, on the output channels of `data.*` and
    the statistics and time step of `dataset` (an `ERA5Dataset` of that data config)."""
    post_conf = model_cfg.get("post_conf")
    if isinstance(post_conf, DictConfig):
        post_conf = OmegaConf.to_container(post_conf, resolve=True)
    if not post_conf or not post_conf.get("activate", False):
        return RunPostBlocks(None, None)
    variables = data_cfg["variables"]
    levels = len(data_cfg["levels"]) if variables["upper_air"] else 0
    output = ([name for name in variables["upper_air"] for _ in range(levels)] + list(variables["surface"])
              + list(variables["diagnostic"]))
    # float32 statistics, as CREDIT's scaler applies its per-level 0-d tensors to the float32
    # forecast: float64 ones (CREDIT's gen1 files) would promote the forecast to float64
    stats = [torch.from_numpy(np.asarray(s, dtype=np.float32)) for s in (dataset.target_mean, dataset.target_std)]
    if getattr(dataset, "output_inverse", None) is not None:
        raise PostBlockConfigError("model.post_conf: the outputs go through pointwise inverse blocks "
                                   "(data.credit.output_inverse: CREDIT's exp/square postblocks); the conservation "
                                   "fixers act on de-normalised fields without them")
    if any(s.ndim != 1 for s in stats):
        raise PostBlockConfigError("model.post_conf: the output statistics vary over the grid (a per-grid-point "
                                   "scaler, data.credit.spatial_variables); the conservation fixers de-normalise "
                                   "with one mean and std per channel, as CREDIT's do")
    layout = ChannelLayout(output, len(variables["upper_air"]) * levels + len(variables["surface"]), *stats,
                           normalized=bool(data_cfg["normalize"]))
    physics_path = None
    if data_cfg.get("physics_file"):
        physics_path = Path(str(data_cfg["physics_file"])).expanduser()
        if not physics_path.is_absolute():
            physics_path = Path(str(data_cfg["root"])) / physics_path
        if not physics_path.is_file():
            raise PostBlockConfigError(f"data.physics_file={data_cfg['physics_file']}: no such file ({physics_path})")
    seconds = int(round(dataset.step_ns / 1e9))
    deterministic = model_cfg.get("gemm", "fast") == "deterministic"
    blocks = build_fixers(post_conf, layout, physics_path, "data.physics_file", seconds, deterministic)
    for fixers in (blocks.inside, blocks.outside):
        for fixer in fixers.fixers if fixers is not None else []:
            physics = getattr(fixer, "physics", None)
            if physics is not None and levels and physics.levels() != levels:
                raise PostBlockConfigError(f"data.physics_file={physics_path}: {physics.levels()} levels for the "
                                           f"{levels} of data.levels")
    return blocks
