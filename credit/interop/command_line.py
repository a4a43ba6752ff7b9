"""`--credit-config FILE` on a command line: the CREDIT file read as CREDIT reads it, its model
and mapped keys turned into this project's overrides, ahead of the user's (which win)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any


def credit_file_overrides(args: Sequence[str], report: bool = False) -> tuple[list[str], list[str]]:
    """`--credit-config FILE` among `args` -> (the overrides FILE maps to followed by the rest of
    `args`, which win; the report lines). Refusals and unreadable files raise ValueError; the
    keys ignored are named in one warning (the whole mapping with `report`)."""
    args = list(args)
    if "--credit-config" not in args:
        return args, []
    at = args.index("--credit-config")
    if at + 1 >= len(args):
        raise ValueError("--credit-config needs the path of a CREDIT config file")
    path = args[at + 1]
    from credit.interop.checkpoint_import import describe_credit_model
    from credit.interop.config_file import map_credit_file
    from credit.interop.data_grid import grid_mismatch
    from credit.models.credit.checkpoint import read_credit_config

    config = read_credit_config(path)
    mapping = map_credit_file(config)
    mismatch = None if mapping.refused else (grid_mismatch(dict(config.get("model") or {}), mapping.overrides)
                                             or channel_mismatch(dict(config.get("model") or {}), mapping.overrides))
    if mismatch:
        raise ValueError(f"{path}: {mismatch}")
    lines, refused, model_overrides = describe_credit_model(path)
    lines += ["# the data, trainer and loss keys", *mapping.lines]
    refused = [*refused, *mapping.refused]
    if refused:
        if report:
            print("\n".join(lines))
        raise ValueError(refused[0] if len(refused) == 1 else f"{refused[0]} (and {len(refused) - 1} more: "
                                                              f"credit check --credit-config {path})")
    for why in mapping.read_otherwise if not report and os.environ.get("RANK", "0") == "0" else ():
        print(f"warning: {path}: {why}", file=sys.stderr)
    if mapping.ignored and not report and os.environ.get("RANK", "0") == "0":
        print(f"warning: {path}: CREDIT keys ignored here: {', '.join(mapping.ignored)} (credit check "
              f"--credit-config {path} says why)", file=sys.stderr)
    rest = [*args[:at], *args[at + 2:]]
    mapped = mapping.overrides
    if any(arg.startswith("parallelism=") for arg in rest):  # the layout the user picks wins whole
        mapped = [o for o in mapped if not o.startswith(("trainer.parallelism.data=", "trainer.parallelism.tensor="))]
    # a run length the user gives wins over the file's epochs (which would set it again at start)
    for given, from_epochs in (("trainer.max_steps=", "trainer.epochs="),
                               ("trainer.steps_per_job=", "trainer.epochs_per_job=")):
        if any(arg.startswith(given) for arg in rest):
            mapped = [o for o in mapped if not o.startswith(from_epochs)]
    if any(o.startswith("data.credit.tisr=") for o in mapped):  # CREDIT reads the table from its package
        from credit.interop.tisr import find_tsi_table
        from credit.models.credit.config import hydra_value

        table = find_tsi_table(path)
        mapped = [*mapped, *([f"data.credit.tisr.tsi_table={hydra_value(str(table))}"] if table else [])]
    geopotential = next((o for o in mapped if o.startswith("data.credit.geopotential=")), None)
    if geopotential is not None:  # a bare level file name is one of CREDIT's package
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from credit.interop.paths import find_metadata_file
        from credit.models.credit.config import hydra_value

        level_file = str(OverridesParser.create().parse_override(geopotential).value()["level_info_file"])
        found = find_metadata_file(path, level_file) if os.path.basename(level_file) == level_file else None
        mapped = [*mapped, *([f"data.credit.geopotential.level_info_file={hydra_value(str(found))}"] if found else [])]
    return [*model_overrides, *mapped, *rest], lines


def channel_mismatch(model: Mapping[str, Any], overrides: Sequence[str]) -> str | None:
    """One line when the model section's channel counts (where set) are not those of the
    variable lists the file's data section gives (mapped to `overrides`), as `credit train`
    would find at its first step (`check_model_channels`, the one rule); None otherwise. CREDIT
    builds its model from the counts alone, so such a file's model takes other channels than
    its data gives, or outputs other channels than its targets."""
    from omegaconf import OmegaConf

    from credit.config import ConfigError
    from credit.data.from_config import check_model_channels

    keys = ("data.layout=", "data.variables.", "data.levels=", "data.credit.forcing_file_variables=")
    if not any(o.startswith("data.variables.") for o in overrides):  # a file of a model section alone
        return None
    data = OmegaConf.merge(
        OmegaConf.create({"layout": "credit-gen1", "levels": [], "history_len": 1, "credit": {"forcing_file_variables": []},
                          "variables": {role: [] for role in ("upper_air", "surface", "forcing", "static", "diagnostic")}}),
        OmegaConf.from_dotlist([o for o in overrides if o.startswith(keys)]).get("data", {}))
    try:
        check_model_channels(data, OmegaConf.create({"name": model.get("type"), **{k: v for k, v in model.items()
                                                                                     if k != "type"}}))
    except ConfigError as error:
        found = re.match(r"model\.(\w+)=(\S+) does not match the data: .* gives (\d+);", str(error))
        if found is None:
            raise
        key, value, count = found.groups()
        return (f"model.{key}: {value}, but {_CREDIT_LISTS[data.layout][key]} name {count}: the file's model: "
                "section counts other channels than its data: section lists, and CREDIT builds its model from these "
                "counts alone; make the two agree")
    return None


# where a CREDIT file lists the variables each of its model's channel counts counts
_CREDIT_LISTS = {
    "credit-gen1": {"channels": "data.variables", "levels": "the upper-air files' levels",
                    "surface_channels": "data.surface_variables", "output_only_channels": "data.diagnostic_variables",
                    "input_only_channels": "data.dynamic_forcing_variables, forcing_variables and static_variables"},
    "credit-gen2": {"channels": "the source's prognostic vars_3D", "levels": "the source's levels",
                    "surface_channels": "the source's prognostic vars_2D",
                    "input_only_channels": "the source's dynamic_forcing and static vars_2D (and a tisr source's tisr)",
                    "output_only_channels": "the source's diagnostic vars_2D"},
}
