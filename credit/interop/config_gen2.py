"""The converters of CREDIT's gen2 schema (`data.source`, `validation_data`,
`trainer.parallelism`, `inference`; its blocks and loss: `config_gen2_blocks`) that the mapping table
(`credit.interop.config_file.TABLE`) names; each takes (the key's value, the whole CREDIT config)
and returns this project's (key, value) pairs, or a refusal line naming the key. What each
key means is CREDIT's gen2 dataset, preblocks and trainer (docs/credit_config.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from credit.interop.paths import expand

FIELD_TYPES = ("prognostic", "dynamic_forcing", "static", "diagnostic")
# data.source.<NAME> keys read here; the others CREDIT's local dataset reads are refused by name
_SOURCE_KEYS = {"dataset_type", "level_coord", "levels", "variables", "mode", "engine", "time_coord"}
_ROLE_OF = {"prognostic": "upper_air", "dynamic_forcing": "forcing", "static": "static", "diagnostic": "diagnostic"}


def is_gen2(conf: Mapping[str, Any]) -> bool:
    """A gen2 config names its data by source (`data.source`)."""
    data = conf.get("data")
    return isinstance(data, Mapping) and "source" in data


def _is_solar(source: Any) -> bool:
    return isinstance(source, Mapping) and source.get("dataset_type") == "tisr"


def only_source(section: Mapping[str, Any], key: str) -> tuple[str, Mapping[str, Any]] | str:
    """The one source of files (beside it, a `tisr` source may compute its solar radiation)."""
    sources = dict(section.get("source") or {})
    files = {name: src for name, src in sources.items() if not _is_solar(src)}
    if len(files) != 1 or len(sources) - len(files) > 1:
        return (f"{key}.source: {len(sources)} sources ({', '.join(sources) or 'none'}); one ERA5 source is read "
                "here, with at most one tisr source beside it (multi-source training is not implemented)")
    name, source = next(iter(files.items()))
    return name, dict(source or {})


def solar_source(section: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """The `tisr` source of a config's `data`, if it has one."""
    found = [(name, dict(src)) for name, src in dict(section.get("source") or {}).items() if _is_solar(src)]
    return found[0] if found else None


_SOLAR_KEYS = {"dataset_type", "variables", "num_integration_steps", "lat_spec", "lon_spec", "latlon_grid_path",
               "device"}


def _solar(name: str, src: Mapping[str, Any], conf: Mapping[str, Any], files: str) -> list[tuple[str, Any]] | str:
    """A `tisr` source (CREDIT's TISRDataset) beside the source of `files`: its variable appended
    to the dynamic forcing, computed (credit/interop/tisr.py) on its spec grid or grid file."""
    key = f"data.source.{name}"
    sources = list(dict(conf["data"]["source"]))
    if sources.index(name) < sources.index(files):
        return (f"{key}: a tisr source listed before the files' source; CREDIT's concat puts its channels first, "
                "ahead of the state channels, which this project's models keep first: list it after them")
    unknown = sorted(set(src) - _SOLAR_KEYS)
    if unknown:
        return f"{key}.{unknown[0]}: not implemented (the tisr keys read here: {', '.join(sorted(_SOLAR_KEYS))})"
    groups = dict(src.get("variables") or {})
    names = [v for group in groups.values() if isinstance(group, Mapping)
             for v in (*(group.get("vars_3D") or []), *(group.get("vars_2D") or []))]
    forcing = dict(groups.get("dynamic_forcing") or {}).get("vars_2D") or []
    if list(forcing) != ["tisr"] or names != ["tisr"]:
        return (f"{key}.variables: {names}; CREDIT's tisr source gives one dynamic forcing variable, "
                "dynamic_forcing.vars_2D: ['tisr']")
    has_specs = src.get("lat_spec") is not None or src.get("lon_spec") is not None
    if has_specs == (src.get("latlon_grid_path") is not None) or (has_specs and None in (src.get("lat_spec"),
                                                                                          src.get("lon_spec"))):
        return f"{key}: give latlon_grid_path, or lat_spec and lon_spec (CREDIT's tisr source reads exactly one)"
    model = dict(conf.get("model") or {})
    for spec, size in (("lat_spec", "image_height"), ("lon_spec", "image_width")):
        points = src.get(spec)
        if isinstance(points, (list, tuple)) and len(points) == 3 and model.get(size) is not None \
                and points[2] != model[size]:
            return (f"{key}.{spec}: {points[2]} points, but model.{size} is {model[size]}: CREDIT concatenates the "
                    "sources' fields, so tisr must be on the data's grid")
    section = {"source": name, "variable": "tisr", "integration_steps": int(src.get("num_integration_steps", 360)),
               "lat_spec": src.get("lat_spec"), "lon_spec": src.get("lon_spec"),
               "grid_file": expand(src["latlon_grid_path"]) if src.get("latlon_grid_path") else None}
    pairs: list[tuple[str, Any]] = [("data.credit.tisr", section)]
    if src.get("device") not in (None, "cpu"):
        pairs.append((None, f"{key}.device: {src['device']!r}; tisr is computed on the CPU in the data loader "
                            "(CREDIT's default; its values do not depend on it beyond rounding)"))
    return pairs


def source(value: Any, conf: Mapping[str, Any]):
    """`data.source.<NAME>`: variables, path templates and levels of CREDIT's local dataset."""
    found = only_source(conf["data"], "data")
    if isinstance(found, str):
        return found
    name, src = found
    key = f"data.source.{name}"
    if src.get("dataset_type") != "local":
        return (f"{key}.dataset_type: {src.get('dataset_type')!r}; CREDIT's local files (dataset_type: local) are "
                "read here")
    unknown = sorted(set(src) - _SOURCE_KEYS)
    if unknown:
        return f"{key}.{unknown[0]}: not implemented (the source keys read here: {', '.join(sorted(_SOURCE_KEYS))})"
    if src.get("time_coord", "time") != "time":
        return f"{key}.time_coord: {src['time_coord']!r}; files with a `time` coordinate are read here"
    variables = dict(src.get("variables") or {})
    extra = sorted(set(variables) - set(FIELD_TYPES))
    if extra:
        return f"{key}.variables.{extra[0]}: CREDIT's field types are {', '.join(FIELD_TYPES)}"
    pairs: list[tuple[str, Any]] = []
    for field_type in FIELD_TYPES:
        group = variables.get(field_type)
        group = group if isinstance(group, Mapping) else {}  # CREDIT: null disables the group
        vars_3d, vars_2d = list(group.get("vars_3D") or []), list(group.get("vars_2D") or [])
        if vars_3d and field_type != "prognostic":
            return (f"{key}.variables.{field_type}.vars_3D: {vars_3d}; 3-D {field_type} variables are not "
                    "implemented (2-D ones are)")
        if field_type == "prognostic":
            pairs += [("data.variables.upper_air", vars_3d), ("data.variables.surface", vars_2d)]
        else:
            pairs.append((f"data.variables.{_ROLE_OF[field_type]}", vars_2d))
        if vars_3d or vars_2d:
            if not group.get("path"):
                return f"{key}.variables.{field_type}.path: missing (the files of {vars_3d + vars_2d})"
            pairs.append((f"data.credit.files.{field_type}", expand(group["path"])))
    coord = str(src.get("level_coord") or "level")
    pairs += [("data.credit.level_coord", coord), ("data.level_dim", coord)]
    levels = src.get("levels")
    if levels is None:  # CREDIT: every level of the files, in file order
        levels = file_levels(dict(variables.get("prognostic") or {}).get("path"), coord)
        if isinstance(levels, str):
            return f"{key}.levels: unset, and {levels}"
    pairs.append(("data.levels", [float(v) for v in levels]))
    prognostic = dict(variables.get("prognostic") or {}).get("path")
    if prognostic:
        pairs.append(("data.root", str(Path(expand(prognostic)).parent)))
    solar = solar_source(conf["data"])
    if solar is not None:
        added = _solar(*solar, conf, name)
        if isinstance(added, str):
            return added
        forcing = dict(pairs)["data.variables.forcing"]
        if "tisr" in forcing:
            return (f"{key}.variables.dynamic_forcing: names tisr, which data.source.{solar[0]} computes too; "
                    "CREDIT keeps both under their sources' keys, this project's channels by name: rename one")
        pairs = [(k, [*v, "tisr"] if k == "data.variables.forcing" else v) for k, v in pairs] + added
    return pairs


def file_levels(template: Any, coord: str) -> list[float] | str:
    """The level coordinate of the first file a path template matches."""
    if not template:
        return "no prognostic path to read the levels from"
    from credit.data.catalog import open_store  # the data layer, read here for one coordinate
    from credit.interop.path_templates import template_files

    found = template_files(".", expand(template))
    if not found:
        return f"{template!r} matches no file to read the levels from"
    with open_store(found[0][0], cache=False) as ds:
        if coord not in ds.coords and coord not in ds.dims:
            return f"{found[0][0]} has no level coordinate {coord!r}"
        return [float(v) for v in np.asarray(ds[coord].values)]


def span(value: Any) -> pd.Timedelta:
    """A CREDIT time span ('6h', '1d', '10d'): pandas reads it, days spelled either way."""
    text = str(value).strip()
    return pd.Timedelta(text[:-1] + "D" if text.endswith("d") else text)


def timestamp(value: Any) -> str:
    """CREDIT parses datetimes with pandas: '2018-12-31' is that day's 00Z (never the whole day)."""
    return pd.Timestamp(str(value)).strftime("%Y-%m-%dT%H:%M:%S")


def period(section: str, target: str):
    def convert(value: Any, conf: Mapping[str, Any]):
        values = conf.get(section) or {}
        if "start_datetime" not in values or "end_datetime" not in values:
            return f"{section}.start_datetime/end_datetime: both are needed (date_ranges is not read here)"
        start, end = timestamp(values["start_datetime"]), timestamp(values["end_datetime"])
        if end < start:
            return f"{section}.end_datetime: {values['end_datetime']} is before start_datetime"
        pairs = [(target, [start, end])]
        if section == "data" and not conf.get("validation_data"):  # CREDIT's gen2 trainer validates on `data` then
            pairs.append(("data.valid_period", [start, end]))
        return pairs

    return convert


def timestep(value: Any, conf: Mapping[str, Any]):
    try:
        step = span(value)
    except ValueError:
        return f"data.timestep: {value!r} is not a time span (e.g. '6h')"
    if step <= pd.Timedelta(0):
        return f"data.timestep: {value!r} must be positive"
    return [("data.credit.timestep", str(value))]


def forecast_len(value: Any, conf: Mapping[str, Any]):
    # gen2 counts 1 for one step; its trainer backpropagates each step's loss: their sum.
    # Validation rolls out as many steps unless `validation_data.forecast_len` says otherwise.
    pairs = [("data.forecast_len", int(value)), ("trainer.loss.forecast_steps", "sum")]
    if (conf.get("validation_data") or {}).get("forecast_len") is None:
        pairs.append(("data.valid_forecast_len", int(value)))
    return pairs


def validation_data(value: Any, conf: Mapping[str, Any]):
    """`validation_data`: its period and forecast_len (validation's lead, the last step scored,
    as CREDIT's gen2 trainer scores it); the same source and history."""
    value = dict(value or {})
    data = conf.get("data") or {}
    if "source" in value and value["source"] != data.get("source"):
        return "validation_data.source: differs from data.source; validation reads the training source here"
    if int(value.get("history_len", data.get("history_len", 1))) != int(data.get("history_len", 1)):
        return "validation_data.history_len: differs from data.history_len; validation here uses data.history_len"
    if value.get("timestep") is not None and span(value["timestep"]) != span(data.get("timestep")):
        return "validation_data.timestep: differs from data.timestep"
    pairs = period("validation_data", "data.valid_period")(None, {"validation_data": value})
    if isinstance(pairs, str) or value.get("forecast_len") is None:
        return pairs
    return [*pairs, ("data.valid_forecast_len", int(value["forecast_len"]))]


def parallelism(value: Any, conf: Mapping[str, Any]):
    value = dict(value or {})
    extra = sorted(set(value) - {"data", "tensor", "domain"})
    if extra:
        return f"trainer.parallelism.{extra[0]}: CREDIT's keys are data, tensor and domain"
    data = value.get("data", "none")
    if data not in ("none", "ddp", "fsdp2"):
        return f"trainer.parallelism.data: {data!r}; allowed: none, ddp, fsdp2"
    if int(value.get("domain", 1)) > 1:
        return (f"trainer.parallelism.domain: {value['domain']}; CREDIT's domain parallelism computes "
                "long-distance attention within each shard, another model than its one-GPU run; here sequence "
                "parallelism splits the grid with the one-GPU arithmetic: trainer.parallelism.sequence_parallel=true "
                "over the tensor ranks")
    return [("trainer.parallelism.data", data), ("trainer.parallelism.tensor", int(value.get("tensor", 1)))]


def grad_max_norm(value: Any, conf: Mapping[str, Any]):
    """gen2: 0 (its default) does not clip; 'dynamic' clips to the norm itself, which does not clip."""
    if value == "dynamic" or value is None or float(value) == 0:
        return [("trainer.grad_clip", 0.0)]
    return [("trainer.grad_clip", float(value))]


def inference(value: Any, conf: Mapping[str, Any]):
    """CREDIT's gen2 `inference` (rollout_gen2): batch init dates every init_interval, forecast_length."""
    value = dict(value or {})
    mode = value.get("run_mode", "batch")
    step = span((conf.get("data") or {}).get("timestep", "6h"))
    if mode == "batch":
        batch = dict(value.get("batch_forecast") or {})
        first, last = pd.Timestamp(str(batch["first_init_date"])), pd.Timestamp(str(batch["last_init_date"]))
        every = span(batch.get("init_interval", "24h"))
        inits = list(pd.date_range(first, last, freq=every)) if last >= first else []
        length = batch.get("forecast_length", "10d")
    elif mode == "single":
        single = dict(value.get("single_forecast") or {})
        inits = [pd.Timestamp(str(single["start_datetime"])).tz_localize(None)]
        length = single.get("forecast_length") or dict(value.get("batch_forecast") or {}).get("forecast_length", "10d")
    else:
        return f"inference.run_mode: {mode!r}; CREDIT's run modes are batch and single"
    steps = int(span(length) / step)
    if steps <= 0 or not inits:
        return f"inference: {len(inits)} init times of {steps} steps; nothing to forecast"
    pairs: list[tuple[str, Any]] = [("rollout.init_times", [t.strftime("%Y-%m-%dT%H:%M") for t in inits]),
                                    ("rollout.lead_steps", steps)]
    if value.get("save_forecast"):
        pairs.append(("rollout.output_dir", expand(value["save_forecast"])))
    return pairs


def output_variables(conf: Mapping[str, Any]) -> set[str]:
    """The variables a gen2 config's model outputs (prognostic and diagnostic)."""
    found = only_source(conf["data"], "data")
    if isinstance(found, str):
        return set()
    groups = dict(found[1].get("variables") or {})
    out: set[str] = set()
    for field_type in ("prognostic", "diagnostic"):
        group = groups.get(field_type)
        if isinstance(group, Mapping):
            out |= {*(group.get("vars_3D") or []), *(group.get("vars_2D") or [])}
    return out
