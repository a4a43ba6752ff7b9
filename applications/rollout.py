"""Rollout entry point for hydra users and launchers: `python applications/rollout.py KEY=VALUE ...`.

Takes the same overrides as `credit rollout`; under torchrun every rank composes the same
config, runs every forward pass, and rank 0 writes the forecasts.
"""

import sys

import hydra
from omegaconf import DictConfig

from credit.config import ConfigError, finalize_config, register_configs

register_configs()


@hydra.main(config_path="pkg://credit.conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    from credit.data import DataError
    from credit.rollout import RolloutError, run_rollout

    try:
        run_rollout(finalize_config(cfg))
    except (ConfigError, DataError, RolloutError, FileExistsError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
