"""CREDIT's `geopotential_diagnostic` postblock as `data.credit.geopotential`
(credit/interop/geopotential.py), for the postblocks converter (`config_gen2_blocks`): its
arguments checked and mapped to bare names, or a refusal line naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from credit.interop.paths import expand

ARGUMENTS = {"output_name", "chunk_size", "surface_geopotential_var", "surface_pressure_var", "temperature_var",
             "specific_humidity_var", "flip_vertical", "level_info_file", "model_a_half_var", "model_b_half_var",
             "key", "static_source_key", "levels"}
# CREDIT's defaults for its input variables, and what each must be among the data's var keys
_INPUTS = {"surface_geopotential": ("surface_geopotential_var", "ARCO_ERA5/static/2d/geopotential_at_surface",
                                    ("static", "2d")),
           "surface_pressure": ("surface_pressure_var", "ARCO_ERA5/prognostic/2d/surface_pressure",
                                ("prognostic", "2d")),
           "temperature": ("temperature_var", "ARCO_ERA5/prognostic/3d/temperature", ("prognostic", "3d")),
           "specific_humidity": ("specific_humidity_var", "ARCO_ERA5/prognostic/3d/specific_humidity",
                                 ("prognostic", "3d"))}


def geopotential_section(where: str, args: Mapping[str, Any], keys: Mapping[str, str]) -> dict | str:
    """The `data.credit.geopotential` section of one geopotential_diagnostic block (`keys`: the
    data's var keys to bare names). A bare level file name is a file of CREDIT's package, which
    `credit.interop.command_line` looks for in the CREDIT checkout that holds the config."""
    extra = sorted(set(args) - ARGUMENTS)
    if extra:
        return f"{where}.args.{extra[0]}: not an argument of CREDIT's geopotential_diagnostic postblock"
    if args.get("static_source_key", "ic_raw") != "ic_raw":
        return (f"{where}.args.static_source_key: {args['static_source_key']!r}; the surface geopotential is read "
                "from the raw inputs (ic_raw) here")
    section: dict[str, Any] = {}
    for role, (arg, default, (field_type, dims)) in _INPUTS.items():
        key = str(args.get(arg, default))
        parts = key.split("/")
        if key not in keys or parts[1:3] != [field_type, dims]:
            return (f"{where}.args.{arg}: {key!r}; a {field_type} {dims} variable of the data "
                    f"({sorted(k for k in keys if k.split('/')[1:3] == [field_type, dims])})")
        section[role] = keys[key]
    output = str(args.get("output_name", "ARCO_ERA5/derived_diagnostic/3d/geopotential"))
    name = output.split("/")[-1]
    if len(output.split("/")) != 4 or name in keys.values():
        return (f"{where}.args.output_name: {output!r}; a var key SOURCE/TYPE/3d/NAME whose NAME no variable of "
                "the data has")
    levels = args.get("levels")
    if levels is not None and (not isinstance(levels, list) or not all(isinstance(v, int) for v in levels)):
        return f"{where}.args.levels: {levels!r}; a list of model levels (1-based ints)"
    level_file = expand(str(args.get("level_info_file", "ERA5_Lev_Info.nc")))
    section.update(output=name, output_key=output, flip_vertical=bool(args.get("flip_vertical", True)),
                   level_info_file=level_file,
                   a_half_variable=str(args.get("model_a_half_var", "a_half")),
                   b_half_variable=str(args.get("model_b_half_var", "b_half")), levels=levels)
    return section

