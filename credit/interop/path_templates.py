"""CREDIT's gen2 path templates (`data.source.ERA5.variables.*.path`): a glob with strftime
codes (`%Y`, ...) whose matches are dated by their names.

One matching file serves every time; several each serve the period their name's date spells
(a `%Y` file: its year, a `%Y%m` file: its month). Hand-written: glob gives the files and
pandas the periods, but nothing reads a date back out of a strftime template.
"""

from __future__ import annotations

import glob
import re
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from credit.data.catalog import DataError

_CODES = {"%Y": r"\d{4}", "%y": r"\d{2}", "%m": r"\d{2}", "%d": r"\d{2}", "%H": r"\d{2}", "%M": r"\d{2}",
          "%S": r"\d{2}", "%j": r"\d{3}", "%f": r"\d{1,6}"}
_FREQ = (("%S", "s"), ("%M", "min"), ("%H", "h"), ("%j", "D"), ("%d", "D"), ("%m", "M"))  # finest first


def template_files(root: str | Path, template: str) -> list[tuple[Path, int, int]]:
    """The files of a CREDIT path template with the [start, end] (ns) each serves, by start.

    One match serves every time; several are dated by the template's strftime codes."""
    full = template if Path(template).is_absolute() else str(Path(root) / template)
    pattern = full
    for code in _CODES:
        pattern = pattern.replace(code, "*")
    found = sorted(Path(p) for p in glob.glob(pattern))
    if len(found) <= 1:
        return [(p, np.iinfo(np.int64).min, np.iinfo(np.int64).max) for p in found]
    codes = re.findall(r"%[A-Za-z]", full)
    if not codes:
        raise DataError(f"{template!r} matches {len(found)} files but holds no date code (%Y ...) to tell "
                        "them apart")
    first, last = full.index(codes[0]), full.rindex(codes[-1]) + 2
    regex = re.compile(_as_regex(full[:first]) + "(" + _as_regex(full[first:last]) + ")" + _as_regex(full[last:]))
    fmt = full[first:last]
    freq = next((f for code, f in _FREQ if code in fmt), "Y")
    spans = []
    for path in found:
        match = regex.fullmatch(str(path))
        if match is None:
            raise DataError(f"{path} matches the glob of {template!r} but not its date pattern")
        try:
            period = pd.Period(datetime.strptime(match.group(1), fmt), freq)
        except ValueError as err:
            raise DataError(f"{path}: the date {match.group(1)!r} does not read as {fmt!r} ({template!r}): "
                            f"{err}") from None
        spans.append((path, int(period.start_time.value), int(period.end_time.value)))
    return sorted(spans, key=lambda span: span[1])


def _as_regex(text: str) -> str:
    """A piece of a path template as a regular expression: date codes as digits, glob
    wildcards within one path component, everything else literal."""
    out = ""
    for piece in re.split(r"(%[A-Za-z])", text):
        if piece in _CODES:
            out += _CODES[piece]
        else:
            out += "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in piece)
    return out
