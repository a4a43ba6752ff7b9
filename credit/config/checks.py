"""The config checks' error and its one-line form: `key=value is invalid: what is allowed`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ConfigError(ValueError):
    """A config key holds a value the run cannot use."""


def check(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise `ConfigError` naming `key`, `value` and what is `allowed` unless `ok`."""
    if not ok:
        raise ConfigError(f"{key}={show_value(value)} is invalid: {allowed}")


def show_value(value: Any) -> str:
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__") and not isinstance(value, str):
        return str(list(value))
    return repr(value) if isinstance(value, str) else str(value)


def check_each(key: str, values: Any, test: Callable[[Any], bool], allowed: str) -> None:
    """`check` every one of `values` (the error shows the whole list)."""
    for value in values:
        check(test(value), key, values, allowed)
