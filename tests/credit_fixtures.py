"""Comparisons against the outputs of CREDIT's own code (tests/fixtures/credit_reference,
tests/fixtures/credit_postblocks), shared by the one-process and the multi-rank tests."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import torch
import yaml

from credit.models.credit.postblocks.fixers import GlobalMassFixer


FP32_UNIT_ROUNDOFF = 2.0 ** -24


def sum_rounding_bound(n: int) -> float:
    """Bound on the rounding error of torch's CPU sum of n fp32 terms, relative to the sum of
    their magnitudes: its cascade adds 16-term running sums on up to four levels (at most 15
    additions a term per level), then at most 10 more to join ILP accumulators, vector lanes
    and threads. The order, and so the bits, depend on the CPU's vector width."""
    levels = max(1, math.ceil(math.log(n, 16)))
    return (15 * levels + 10) * FP32_UNIT_ROUNDOFF


def physical_difference(model: torch.nn.Module, ours: torch.Tensor, credit: torch.Tensor) -> float:
    """The largest per-channel |ours - CREDIT| / max |CREDIT| of two normalised forecasts
    of a model with post blocks (`model.post_blocks`), in physical units, beyond the rounding
    grid of the moisture the mass fixer rescales (`_mass_fixer_grid`)."""
    fixer = model.post_blocks.fixers[0]
    ours, credit = ours * fixer.std + fixer.mean, credit * fixer.std + fixer.mean
    excess = ((ours - credit).abs() - _mass_fixer_grid(model, ours.shape[1]).view(1, -1, 1, 1, 1)).clamp_min(0)
    per_channel = excess.amax(dim=(0, 2, 3, 4)) / credit.abs().amax(dim=(0, 2, 3, 4))
    return per_channel.max().item()


def _mass_fixer_grid(model: torch.nn.Module, channels: int) -> torch.Tensor:
    """Per channel, what rounding alone can put between two runs' fixed moisture: on pressure
    levels the mass fixer computes 1 - (1 - q) r, so q lands on the 2^-24 grid of values near 1.
    1 - q and the product each round to it, and r (~1, the same grid) may differ in its last
    bit or two: an error bound of 4 grid steps (measured: 1, on every CPU path tried)."""
    grid = torch.zeros(channels)
    for fixer in model.post_blocks.fixers:
        if isinstance(fixer, GlobalMassFixer) and not fixer.physics.sigma:
            grid[torch.arange(channels)[fixer.water][fixer.start:]] = 4 * FP32_UNIT_ROUNDOFF
    return grid


CHECKPOINT_RUN = Path(__file__).resolve().parent / "fixtures" / "credit_gen1_checkpoint"
_RELATIVE_DATA_KEYS = ("save_loc", "save_loc_surface", "save_loc_dynamic_forcing", "save_loc_static",
                       "mean_path", "std_path")


def credit_run_config(out: Path, fixture: Path = CHECKPOINT_RUN, *, resume: bool = True) -> Path:
    """CREDIT's config of the fixture run (tests/fixtures/credit_gen1_checkpoint) with its
    paths made absolute, `save_loc` at `out/run` holding CREDIT's checkpoint.pt, and, with
    `resume`, every reload flag of CREDIT's run 2 set. Returns the config's path."""
    conf = yaml.safe_load((fixture / "credit.yml").read_text())
    run = out / "run"
    run.mkdir(parents=True)
    shutil.copy(fixture / "checkpoint.pt", run / "checkpoint.pt")
    conf["save_loc"] = str(run)
    data = CHECKPOINT_RUN / "data"  # both runs read the same files
    for key in _RELATIVE_DATA_KEYS:
        conf["data"][key] = str(data / Path(conf["data"][key]).name)
    conf["loss"]["latitude_weights"] = str(data / Path(conf["loss"]["latitude_weights"]).name)
    conf.get("predict", {}).pop("save_forecast", None)
    for flag in ("load_weights", "load_optimizer", "load_scheduler", "load_scaler", "reload_epoch"):
        conf["trainer"][flag] = resume
    path = out / "credit.yml"
    path.write_text(yaml.safe_dump(conf))
    return path
