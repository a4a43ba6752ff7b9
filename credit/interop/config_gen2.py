"""The converters of CREDIT's gen2 schema (`data.source`, `validation_data`, `preblocks`,
`postblocks`, `trainer.parallelism`, `inference`) that the mapping table
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


def only_source(section: Mapping[str, Any], key: str) -> tuple[str, Mapping[str, Any]] | str:
    sources = dict(section.get("source") or {})
    if len(sources) != 1:
        return (f"{key}.source: {len(sources)} sources ({', '.join(sources) or 'none'}); one ERA5 source is read "
                "here (multi-source training is not implemented)")
    name, source = next(iter(sources.items()))
    return name, dict(source or {})


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
    return pairs


def file_levels(template: Any, coord: str) -> list[float] | str:
    """The level coordinate of the first file a path template matches."""
    if not template:
        return "no prognostic path to read the levels from"
    from credit.data.catalog import open_store  # the data layer, read here for one coordinate
    from credit.interop.data_gen2 import template_files

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
        return [(target, [start, end])]

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


def source_var_keys(conf: Mapping[str, Any]) -> dict[str, str]:
    """CREDIT's gen2 var keys (`SOURCE/FIELD_TYPE/3d|2d/NAME`) of the one source's variables, to
    their bare names, in CREDIT's batch order; empty when the source is not readable here."""
    found = only_source(conf.get("data") or {}, "data")
    if isinstance(found, str):
        return {}
    name, src = found
    keys = {}
    for field_type in FIELD_TYPES:
        group = dict(src.get("variables") or {}).get(field_type)
        group = group if isinstance(group, Mapping) else {}
        for dims, names in (("3d", group.get("vars_3D") or []), ("2d", group.get("vars_2D") or [])):
            keys.update({f"{name}/{field_type}/{dims}/{v}": v for v in names})
    return keys


def selected(selection: Any, keys: Mapping[str, str]) -> list[str]:
    """CREDIT's variable selection of a pre/postblock: full var keys, or partial paths that take
    every key beneath them; an empty selection takes every key. The bare names, in batch order."""
    wanted = [selection] if isinstance(selection, str) else list(selection or [])
    if not wanted:
        return list(keys.values())
    return [name for key, name in keys.items() if any(key == w or key.startswith(f"{w}/") for w in wanted)]


def _bridgescaler(name: str, args: Mapping[str, Any], conf: Mapping[str, Any]):
    """`bridgescaler_transform` (transform, input and target): the data's statistics are the
    file's scalers of the selected variables (credit/interop/bridgescaler_file.py)."""
    key = f"preblocks.per_step.{name}.args"
    extra = sorted(set(args) - {"scaler_path", "variables", "method", "scaler_type", "scaler_params",
                                "data_types", "spatial_variables"})
    if extra:
        return f"{key}.{extra[0]}: not an argument of CREDIT's bridgescaler_transform"
    if args.get("method", "transform") != "transform":
        return f"{key}.method: {args['method']!r}; a preblock scaler transforms (its inverse is a postblock's)"
    if sorted(args.get("data_types") or ["input", "target"]) != ["input", "target"]:
        return (f"{key}.data_types: {list(args['data_types'])}; this project scales input and target alike "
                "(data_types: [input, target], CREDIT's default)")
    if args.get("spatial_variables"):
        return (f"{key}.spatial_variables: {list(args['spatial_variables'])}; per-grid-point scalers are not read "
                "here (one mean and variance per level are)")
    if not args.get("scaler_path"):
        return f"{key}.scaler_path: missing (the bridgescaler file `credit preprocess` writes)"
    keys = source_var_keys(conf)
    names = selected(args.get("variables"), keys)
    if not names:
        return f"{key}.variables: {args.get('variables')!r} selects none of the source's variables {list(keys)}"
    source = next(iter(dict(dict(conf.get("data") or {}).get("source") or {"ERA5": None})))
    # scaler_type and scaler_params only shape a scaler being fitted (`credit preprocess`)
    return [("data.credit.files.bridgescaler", expand(args["scaler_path"])), ("data.credit.source_name", source),
            ("data.credit.scaled_variables", names)]


def preblocks(value: Any, conf: Mapping[str, Any]):
    """CREDIT's `preblocks.per_step`: a normaliser (era5_normalizer: mean/std files, positional
    levels; or bridgescaler_transform: a bridgescaler file), then concat; `to_device` moves the
    tensors, which this project's loader does."""
    value = dict(value or {})
    extra = sorted(set(value) - {"ic_only", "per_step"})
    if extra:
        return (f"preblocks.{extra[0]}: CREDIT's preblocks sections are ic_only and per_step (CREDIT's build_preblocks "
                "refuses any other)")
    if value.get("ic_only"):
        return f"preblocks.ic_only: {sorted(dict(value['ic_only']))}; initial-condition-only preblocks are not read"
    pairs: list[tuple[str, Any]] = []
    kinds = []
    for name, block in dict(value.get("per_step") or {}).items():
        kind = dict(block or {}).get("type")
        args = dict(dict(block or {}).get("args") or {})
        if kind == "to_device":
            continue
        kinds.append(kind)
        if kind == "era5_normalizer":
            pairs += [("data.credit.files.mean", expand(args["mean_path"])),
                      ("data.credit.files.std", expand(args["std_path"])),
                      ("data.credit.stats_levels", [int(v) for v in args["levels"]] if args.get("levels") else None)]
        elif kind == "bridgescaler_transform":
            found = _bridgescaler(name, args, conf)
            if isinstance(found, str):
                return found
            pairs += found
        elif kind != "concat":
            return (f"preblocks.per_step.{name}.type: {kind!r}; era5_normalizer (mean/std files), "
                    "bridgescaler_transform, to_device and concat are read here")
    if kinds not in (["era5_normalizer", "concat"], ["bridgescaler_transform", "concat"]):
        return (f"preblocks.per_step: {kinds}; this project reads one normaliser (era5_normalizer or "
                "bridgescaler_transform) followed by concat (CREDIT's ERA5 examples)")
    return pairs


def preblock_scaler(conf: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The args of the config's `bridgescaler_transform` preblock, if it has one."""
    blocks = dict(dict(conf.get("preblocks") or {}).get("per_step") or {})
    return next((dict(b.get("args") or {}) for b in blocks.values()
                 if isinstance(b, Mapping) and b.get("type") == "bridgescaler_transform"), None)


def _inverse_scaler(where: str, args: Mapping[str, Any], conf: Mapping[str, Any]) -> str | None:
    """A refusal, or None for a `bridgescaler_transform` postblock that undoes the preblock's
    scaling on every output variable it scaled (what the data's target statistics undo here)."""
    extra = sorted(set(args) - {"scaler_path", "variables", "method", "key", "spatial_variables"})
    if extra:
        return f"{where}.args.{extra[0]}: not an argument of CREDIT's bridgescaler_transform postblock"
    if args.get("method", "inverse_transform") != "inverse_transform":
        return f"{where}.args.method: {args['method']!r}; a postblock scaler's inverse_transform is read here"
    if args.get("key", "y_processed") not in ("y_processed", "y_target_processed"):
        return f"{where}.args.key: {args['key']!r}; the prediction (y_processed) and its target twin are read here"
    if args.get("spatial_variables"):
        return f"{where}.args.spatial_variables: per-grid-point scalers are not read here"
    pre = preblock_scaler(conf)
    if pre is None:
        return f"{where}: an inverse scaler is read with a preblock bridgescaler_transform"
    if not args.get("scaler_path"):
        return f"{where}.args.scaler_path: missing"
    keys = source_var_keys(conf)
    outputs = {k: v for k, v in keys.items() if k.split("/")[1] in ("prognostic", "diagnostic")}
    if selected(args.get("variables"), outputs) != selected(pre.get("variables"), outputs):
        return (f"{where}.args.variables: {args.get('variables')!r}; the inverse must undo exactly the output "
                f"variables the preblock scaled ({selected(pre.get('variables'), outputs)})")
    return None


def postblocks(value: Any, conf: Mapping[str, Any]):
    """CREDIT's `postblocks`: `reconstruct` hands the prediction (or with in_key y, the target) on
    as this project does; a `bridgescaler_transform` inverse puts it in physical units, which the
    data's target statistics do here (rollout; the loss with `loss.type: base`)."""
    value = dict(value or {})
    inverse_files = set()
    for section, blocks in value.items():
        for name, block in dict(blocks or {}).items():
            kind = dict(block or {}).get("type")
            args = dict(dict(block or {}).get("args") or {})
            where = f"postblocks.{section}.{name}"
            if kind == "bridgescaler_transform" and section == "per_step":
                refusal = _inverse_scaler(where, args, conf)
                if refusal:
                    return refusal
                inverse_files.add(expand(str(args["scaler_path"])))
            elif kind == "reconstruct":
                pair = (args.get("in_key", "y_pred"), args.get("out_key", "y_processed"))
                if pair not in (("y_pred", "y_processed"), ("y", "y_target_processed")):
                    return (f"{where}.args: in_key {pair[0]!r}, out_key {pair[1]!r}; the prediction "
                            "(y_pred -> y_processed) and its target twin (y -> y_target_processed) are read here")
            else:
                return (f"{where}.type: {kind!r}; reconstruct and the per_step bridgescaler_transform inverse are "
                        "read here (conservation fixers: model.post_conf)")
    if len(inverse_files) > 1:
        return (f"postblocks.per_step: inverse scalers of {len(inverse_files)} files; the prediction and its target "
                "twin are de-normalised with one here")
    return [("data.credit.files.bridgescaler_inverse", f) for f in inverse_files]


def loss(value: Any, conf: Mapping[str, Any]):
    """`loss.type: base` (CREDIT's gen2 BaseLoss): the univariate loss of each output variable in
    physical units (behind the inverse-scaler postblocks), latitude-weighted and averaged over
    the variable's elements, then the variables' weighted mean."""
    from credit.config.validate import LOSS_FUNCTIONS

    if value != "base":
        return (f"loss.type: {value!r}; CREDIT's gen2 BaseLoss (type: base) and its flat loss keys "
                "(training_loss, use_latitude_weights, ...) are read here")
    args = dict(dict(conf.get("loss") or {}).get("args") or {})
    extra = sorted(set(args) - {"training_loss", "base_loss_parameters", "validation_loss",
                                "validation_loss_parameters", "base_loss_overrides", "var_weighting", "scaler_path",
                                "variable_weights", "normalize_weights", "include_computed_diagnostics",
                                "use_latitude_weights", "latitude_weights"})
    if extra:
        return f"loss.args.{extra[0]}: not an argument of CREDIT's BaseLoss"
    function = args.get("training_loss", "mse")
    if function not in LOSS_FUNCTIONS:
        return (f"loss.args.training_loss: {function!r}; CREDIT's elementwise losses are read here "
                f"({', '.join(LOSS_FUNCTIONS)}); ensembles and CRPS losses are not")
    params = dict(args.get("base_loss_parameters") or {})
    if sorted(set(params) - {"delta"}):
        return f"loss.args.base_loss_parameters: {sorted(params)}; only huber's delta is read here"
    if args.get("base_loss_overrides"):
        return (f"loss.args.base_loss_overrides: {sorted(dict(args['base_loss_overrides']))}; one univariate loss "
                "for every variable is read here")
    weighting = args.get("var_weighting", "inverse_variance")
    if weighting not in ("inverse_variance", "manual", "none"):
        return (f"loss.args.var_weighting: {weighting!r}; inverse_variance, manual and none are read here "
                "(learnable weights are not)")
    post = dict(dict(conf.get("postblocks") or {}).get("per_step") or {})
    keys = {dict(dict(b or {}).get("args") or {}).get("key", "y_processed") for b in post.values()
            if dict(b or {}).get("type") == "bridgescaler_transform"}
    if keys != {"y_processed", "y_target_processed"}:
        return ("loss.type: base scores the postblocks' physical units: postblocks.per_step needs the "
                "bridgescaler_transform inverse of y_processed and of its target twin y_target_processed "
                "(CREDIT's BaseLoss)")
    inverse = {expand(str(dict(b.get("args") or {}).get("scaler_path"))) for b in post.values()
               if isinstance(b, Mapping) and b.get("type") == "bridgescaler_transform"}
    if weighting == "inverse_variance" and {expand(str(args.get("scaler_path")))} != inverse:
        return (f"loss.args.scaler_path: {args.get('scaler_path')!r}; inverse_variance weights are read from the "
                "postblocks' bridgescaler file (the statistics that de-normalise the outputs)")
    outputs = output_variables(conf)
    names = source_var_keys(conf)
    weights = {names.get(k, k): float(w) for k, w in dict(args.get("variable_weights") or {}).items()}
    pairs: list[tuple[str, Any]] = [
        ("trainer.loss.function", function), ("trainer.loss.space", "physical"),
        ("trainer.loss.combine", "variables"), ("trainer.loss.inverse_variance", weighting == "inverse_variance"),
        ("trainer.loss.normalize_variable_weights", bool(args.get("normalize_weights", True))),
        ("trainer.loss.latitude_weighting", bool(args.get("use_latitude_weights", False))),
        *((f"+trainer.loss.variable_weights.{name}", w) for name, w in weights.items() if name in outputs)]
    if "delta" in params:
        pairs.append(("trainer.loss.huber_delta", float(params["delta"])))
    return pairs


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
