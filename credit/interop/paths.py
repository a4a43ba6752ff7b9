"""Paths as CREDIT reads them: a config's paths with `~` and `$VARIABLES` expanded, and the
files CREDIT reads from its own package (`credit/metadata`) found in the checkout beside a config."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def expand(path: Any) -> str:
    return os.path.expanduser(os.path.expandvars(str(path)))


def find_metadata_file(config_file: str | Path, name: str) -> Path | None:
    """`credit/metadata/NAME` of the CREDIT checkout that holds `config_file` (its `config/`
    folders sit beside `credit/`), or None."""
    for folder in Path(config_file).resolve().parents:
        candidate = folder / "credit" / "metadata" / name
        if candidate.is_file():
            return candidate
    return None
