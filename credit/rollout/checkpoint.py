"""Whether a rollout's checkpoint was trained with this run's model.

The model is rebuilt from the run's config, so the keys that shape it must equal those stored
in the checkpoint's `config` (the rule: `credit.checkpoint.config_check`); a difference is
one error naming every differing key.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from credit.checkpoint.config_check import model_config_differences, stored_config
from credit.rollout.errors import RolloutError

log = logging.getLogger(__name__)


def check_model_config(cfg: DictConfig, path: Path) -> None:
    """Raise RolloutError when the run's model config differs from the checkpoint's."""
    stored = stored_config(path)
    if stored is None:
        log.warning("checkpoint %s stores no config; the model is checked by its weights only", path)
        return
    differences = model_config_differences(cfg, stored)
    if differences:
        raise RolloutError(
            f"the model config differs from checkpoint {path}: " + "; ".join(differences)
            + " (pass the training run's model/data overrides)")
