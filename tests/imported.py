"""What a `python -X importtime ...` run imported, apart from what it printed: tests that a
command refuses bad input before its slow imports assert on the code path, not on seconds."""

from __future__ import annotations


def imported_and_printed(stderr: str) -> tuple[set[str], list[str]]:
    """The modules a `python -X importtime` run imported, and the rest of its stderr's lines."""
    modules, lines = set(), []
    for line in stderr.strip().splitlines():
        if line.startswith("import time:"):
            modules.add(line.rsplit("|", 1)[1].strip())
        else:
            lines.append(line)
    return modules, lines
