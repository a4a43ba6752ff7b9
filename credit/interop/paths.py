"""A path as CREDIT's scripts read it from their config: `~` and `$VARIABLES` expanded."""

from __future__ import annotations

import os
from typing import Any


def expand(path: Any) -> str:
    return os.path.expanduser(os.path.expandvars(str(path)))
