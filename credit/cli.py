"""The `credit` command: train | check | data generate."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

USAGE = """credit <command> [args]

commands:
  train [KEY=VALUE ...]          train with hydra overrides, e.g. trainer.max_steps=50 run_dir=/tmp/run
  check [KEY=VALUE ...]          compose and validate the config, print it, run nothing
  data generate --out DIR [...]  write the synthetic ERA5-layout dataset (see --help)
"""


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _train(overrides: Sequence[str]) -> int:
    from credit.config import ConfigError, compose_config

    try:
        cfg = compose_config(overrides)
    except ConfigError as error:
        return _fail(str(error))
    from credit.data import DataError
    from credit.train import run_training

    try:
        run_training(cfg)
    except (DataError, FileExistsError, FileNotFoundError) as error:
        return _fail(str(error))
    return 0


def _check(overrides: Sequence[str]) -> int:
    from omegaconf import OmegaConf

    from credit.config import ConfigError, compose_config

    try:
        cfg = compose_config(overrides)
    except ConfigError as error:
        return _fail(str(error))
    print(OmegaConf.to_yaml(cfg), end="")
    print("config OK", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "train":
        return _train(rest)
    if command == "check":
        return _check(rest)
    if command == "data":
        if not rest or rest[0] != "generate":
            return _fail("usage: credit data generate --out DIR [--grid 32x64 --years ...]")
        from credit.data.generate import main as generate_main

        return generate_main(rest[1:])
    return _fail(f"unknown command {command!r}; commands: train, check, data generate")


if __name__ == "__main__":
    sys.exit(main())
