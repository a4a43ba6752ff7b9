"""Compose the hydra config from the packaged `credit.conf` folder and validate it."""

from __future__ import annotations

import itertools
from typing import Any

from collections.abc import Sequence

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from credit.config.schema import MODEL_SCHEMAS, Config, register_configs
from credit.config.validate import ConfigError, validate_config

CONFIG_MODULE = "credit.conf"


def _one_line(error: BaseException) -> str:
    """Hydra/OmegaConf errors span several lines; keep the first line and the key."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    reason = ""
    full_key = ""
    cause: BaseException | None = error.__cause__ or error.__context__
    while cause is not None:
        lines = str(cause).strip().splitlines()
        if lines and not reason and lines[0] not in first:
            reason = lines[0]
        for line in lines:
            if line.strip().startswith("full_key:") and not full_key:
                full_key = line.split(":", 1)[1].strip()
        cause = cause.__cause__ or cause.__context__
    for line in str(error).splitlines():
        if line.strip().startswith("full_key:") and not full_key:
            full_key = line.split(":", 1)[1].strip()
    message = first.rstrip(".")
    lines = str(error).splitlines()
    for i, line in enumerate(lines):  # a group option that does not exist: say which do
        if line.startswith("Available options in"):
            options = [o.strip() for o in itertools.takewhile(lambda o: o.startswith("\t"), lines[i + 1:])]
            message += f"; available: {', '.join(options)}"
            break
    if reason:
        message += f": {reason}"
    if full_key and full_key not in message:
        message += f" (key {full_key})"
    return message


def compose_config(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """Compose `config_name` with command-line style overrides; raise ConfigError on failure."""
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
            cfg = compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as error:
        raise ConfigError(_one_line(error)) from error
    finally:
        GlobalHydra.instance().clear()
    return finalize_config(cfg)


def _typed_model(model: Any) -> DictConfig:
    """The `model` section merged into its type's schema (`MODEL_SCHEMAS`), so an unknown
    key, or a value of the wrong type, is an error naming it."""
    model = dict(model or {})
    schema = MODEL_SCHEMAS.get(model.get("name", "windowformer"))
    if schema is None:
        raise ConfigError(f"model.name={model.get('name')!r} is invalid: allowed: {list(MODEL_SCHEMAS)}")
    try:
        typed = OmegaConf.merge(OmegaConf.structured(schema), model)
    except OmegaConfBaseException as error:
        raise ConfigError(_one_line(error)) from error
    return typed


def finalize_config(cfg: DictConfig) -> DictConfig:
    """Resolve interpolations, drop hydra's own node, validate; the run's config."""
    try:
        container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as error:
        raise ConfigError(_one_line(error)) from error
    container.pop("hydra", None)
    container["model"] = _typed_model(container.get("model"))
    # Re-merge into the schema: `+key=value` overrides bypass struct mode while composing.
    try:
        resolved = OmegaConf.merge(OmegaConf.structured(Config), container)
    except OmegaConfBaseException as error:
        raise ConfigError(_one_line(error)) from error
    OmegaConf.set_struct(resolved, True)
    validate_config(resolved)
    return resolved
