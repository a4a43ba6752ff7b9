"""docs/credit_config.md's table of CREDIT's own config files holds: each file it says maps
maps with no refusal (beside its data: a refusal for a data path that does not exist here is
set aside), and each it says is refused stops first at the line it names (the mapping's, or
`credit check`'s line for a model section whose channel counts are not its data's)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from credit.interop.command_line import channel_mismatch
from credit.interop.config_file import map_credit_file

REPO = Path(__file__).resolve().parents[2]
FILES = json.loads((REPO / "tests" / "fixtures" / "credit_configs" / "whole_files.json").read_text())["files"]
ROW = re.compile(r"^\| `(config/[^`]+)` \| (maps.*|refused: `([^`]+)`.*) \|$")


def _table() -> dict[str, str | None]:
    text = (REPO / "docs" / "credit_config.md").read_text()
    section = text.split("## CREDIT's own config files")[1].split("\n## ")[0]
    rows = {m.group(1): m.group(3) for m in map(ROW.match, section.splitlines()) if m}
    assert f"{sum(v is None for v in rows.values())} map with no refusal" in " ".join(section.split())
    return rows


TABLE = _table()


def test_the_table_lists_every_file_once():
    assert sorted(TABLE) == sorted(FILES) and len(FILES) == 28


@pytest.mark.parametrize("path", sorted(FILES))
def test_the_file_maps_or_stops_where_the_table_says(path):
    mapping = map_credit_file(FILES[path])
    refused = [line for line in mapping.refused if "matches no file" not in line]
    if not refused:  # a model section that counts other channels than the data section lists
        refused = [line for line in [channel_mismatch(FILES[path]["model"], mapping.overrides)] if line]
    if TABLE[path] is None:
        assert refused == []
    else:
        assert refused and refused[0].startswith(TABLE[path]), refused
