"""Structured config schema, composition and validation (`credit check`)."""

from credit.config.load import compose_config, finalize_config
from credit.config.schema import Config, register_configs
from credit.config.validate import ConfigError, validate_config

__all__ = [
    "Config",
    "ConfigError",
    "compose_config",
    "finalize_config",
    "register_configs",
    "validate_config",
]
