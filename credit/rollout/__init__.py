"""Forecasts from a trained checkpoint: autoregressive rollout, CF netCDF output, skill scores
against the dataset's truth, and plots (`credit rollout`)."""

from credit.rollout.errors import RolloutError
from credit.rollout.run import RolloutResult, run_rollout

__all__ = ["RolloutError", "RolloutResult", "run_rollout"]
