"""What a `python -X importtime ...` run imported, apart from what it printed: tests that a
command refuses bad input before its slow imports assert on the code path, not on seconds.

The records are found anywhere in the text, not only as whole lines: a child process started
with the same flags (the launcher's forkserver) writes its own records into the same stderr,
at any point of a line the command is printing."""

from __future__ import annotations

import re

_RECORD = re.compile(r"import time:[^|\n]*\|[^|\n]*\|[^\n]*(\n|$)")


def imported_and_printed(stderr: str) -> tuple[set[str], list[str]]:
    """The modules a `python -X importtime` run (and any child of it) imported, and the rest of
    its stderr's lines."""
    modules = {record.group(0).rsplit("|", 1)[1].strip() for record in _RECORD.finditer(stderr)}
    return modules, _RECORD.sub("", stderr).strip().splitlines()
