"""Comparisons against the outputs of CREDIT's own code (tests/fixtures/credit_reference,
tests/fixtures/credit_postblocks), shared by the one-process and the multi-rank tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import yaml


def physical_difference(model: torch.nn.Module, ours: torch.Tensor, credit: torch.Tensor) -> float:
    """The largest per-channel |ours - CREDIT| / max |CREDIT| of two normalised forecasts
    of a model with post blocks (`model.post_blocks`), in physical units."""
    fixer = model.post_blocks.fixers[0]
    ours, credit = ours * fixer.std + fixer.mean, credit * fixer.std + fixer.mean
    per_channel = (ours - credit).abs().amax(dim=(0, 2, 3, 4)) / credit.abs().amax(dim=(0, 2, 3, 4))
    return per_channel.max().item()


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
