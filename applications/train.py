"""Training entry point for hydra users and launchers: `python applications/train.py KEY=VALUE ...`.

Takes the same overrides as `credit train`; under torchrun every rank composes the same
config and resolves the same run directory.
"""

import sys

import hydra
from omegaconf import DictConfig

from credit.config import ConfigError, compose_config, finalize_config, register_configs

register_configs()


def _fail(error: ConfigError) -> None:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


@hydra.main(config_path="pkg://credit.conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        cfg = finalize_config(cfg)
    except ConfigError as error:
        _fail(error)
    from credit.train import run_training

    run_training(cfg)


if __name__ == "__main__":
    overrides = sys.argv[1:]
    if not any(arg.startswith("-") for arg in overrides):  # hydra's own flags pass straight on
        try:  # a typo fails in one line here, as with `credit train`, not in hydra's report
            compose_config(overrides)
        except ConfigError as error:
            _fail(error)
    main()
