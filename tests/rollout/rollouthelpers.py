"""Constants and small helpers shared by the rollout tests."""

from __future__ import annotations

from pathlib import Path

TRAIN = ["trainer.max_steps=40", "trainer.ema.enabled=true", "trainer.ema.decay=0.8",
         "trainer.valid_every_n_steps=0", "trainer.checkpoint.every_n_steps=20",
         "rollout.progress_bar=false"]
INITS = ["2001-01-02T00", "2001-01-03T06", "2001-01-05T12"]
LEAD_STEPS = 3


def forecast_path(output_dir: Path | str, init: str) -> Path:
    return Path(output_dir) / f"forecast_{init}.nc"
