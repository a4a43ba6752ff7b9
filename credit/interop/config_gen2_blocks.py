"""The converters of CREDIT's gen2 blocks and loss (`preblocks`, `postblocks`, `loss.type`)
that the mapping table (`credit.interop.config_file.TABLE`) names: the normaliser preblock
(era5_normalizer or bridgescaler_transform) and the pointwise preblocks before it (log, sqrt,
fill_values), the inverse-scaler postblocks and the pointwise ones after them (exp, square),
and `inference`'s postblocks (BaseLoss: `config_gen2_loss`). Each
takes (the key's value, the whole CREDIT config) and returns this project's (key, value) pairs,
or a refusal line naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from credit.interop import config_gen2
from credit.interop.config_gen2 import FIELD_TYPES, only_source, output_variables, solar_source
from credit.interop.config_gen1 import READ_OTHERWISE
from credit.interop.config_gen2_computed import geopotential_section
from credit.interop.paths import expand


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
    solar = solar_source(conf.get("data") or {})
    if solar is not None:  # its one variable, after the files' source (config_gen2.source refuses it before)
        keys[f"{solar[0]}/dynamic_forcing/2d/tisr"] = "tisr"
    return keys


def selected(selection: Any, keys: Mapping[str, str]) -> list[str]:
    """CREDIT's variable selection of a pre/postblock: full var keys, or partial paths that take
    every key beneath them; an empty selection takes every key. The bare names, in batch order.
    A string is what CREDIT makes of it, a list of its characters (which select nothing)."""
    wanted = list(selection or [])
    if not wanted:
        return list(keys.values())
    return [name for key, name in keys.items() if any(key == w or key.startswith(f"{w}/") for w in wanted)]


POINTWISE = {"log_transform": "preblocks", "sqrt_transform": "preblocks", "fill_values": "preblocks",
             "exp_transform": "postblocks", "square_transform": "postblocks"}
"""CREDIT's pointwise transforms and the block section each belongs to."""


def selects_nothing(where: str, kind: str, args: Mapping[str, Any], keys: Mapping[str, str]) -> str | None:
    """For a pointwise transform whose `variables` select none of `keys` (a string, which CREDIT
    reads as a list of its characters; or names the data do not hold): the reason CREDIT runs it
    as a no-op, as `where: why`. None when it selects something, or everything (an empty list),
    which this project does not run yet."""
    wanted = args.get("variables")
    if not wanted or not keys or selected(wanted, keys):
        return None
    how = ("a string, which CREDIT reads as a list of its characters" if isinstance(wanted, str)
           else "names none of the data's variables")
    return f"{where}: its variables {wanted!r} are {how}: CREDIT's {kind} transforms nothing"


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
    if not args.get("scaler_path"):
        return f"{key}.scaler_path: missing (the bridgescaler file `credit preprocess` writes)"
    keys = source_var_keys(conf)
    if not keys:  # the source is not read here: its own line says why
        return [("data.credit.files.bridgescaler", expand(args["scaler_path"]))]
    names = selected(args.get("variables"), keys)
    if not names:
        string = (" (a string: CREDIT reads it as a list of its characters and scales nothing; give a list)"
                  if isinstance(args.get("variables"), str) else "")
        return f"{key}.variables: {args.get('variables')!r} selects none of the source's variables{string}"
    spatial = spatial_selection(args, keys)
    if set(spatial) - set(names):
        return (f"{key}.spatial_variables: {sorted(set(spatial) - set(names))} are not among the scaled variables "
                "(CREDIT's bridgescaler_transform raises: spatial_variables must also be selected by `variables`)")
    upper = [k for k, v in keys.items() if v in spatial and k.split("/")[2] == "3d"]
    if upper:
        return (f"{key}.spatial_variables: {upper[0]} is 3-D; per-grid-point scaling takes single-level variables "
                "(CREDIT's scaler raises on a level axis longer than 1)")
    if spatial and int(dict(conf.get("data") or {}).get("history_len", 1) or 1) > 1:
        return (f"{key}.spatial_variables with data.history_len > 1: CREDIT's per-grid-point scaler needs one time "
                "per tensor and raises on the history frames")
    source = only_source(conf.get("data") or {}, "data")[0]  # readable: `keys` holds its variables
    # scaler_type and scaler_params only shape a scaler being fitted (`credit preprocess`)
    return [("data.credit.files.bridgescaler", expand(args["scaler_path"])), ("data.credit.source_name", source),
            ("data.credit.scaled_variables", names), *([("data.credit.spatial_variables", spatial)] * bool(spatial))]


def spatial_selection(args: Mapping[str, Any], keys: Mapping[str, str]) -> list[str]:
    """The bare names a scaler block's `spatial_variables` select (none when it is empty, unlike
    `variables`)."""
    return selected(args["spatial_variables"], keys) if args.get("spatial_variables") else []


PREBLOCK_SECTIONS = ("ic_only", "per_step")


def flat_preblocks(value: Any) -> bool:
    """Whether `preblocks` is CREDIT's layout before its two sections: blocks by name (each with
    a `type`), none of the section names. CREDIT then ran every block at each step and always
    concatenated last; its build_preblocks now refuses the layout and asks for the migration to
    `per_step` that `preblock_sections` makes."""
    return (isinstance(value, Mapping) and bool(value) and not set(value) & set(PREBLOCK_SECTIONS)
            and all(isinstance(block, Mapping) and "type" in block for block in value.values()))


def preblock_sections(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The config's preblocks by section; the flat layout as its `per_step` section, with concat
    last where the file names none. The blocks are the file's own objects (not copies)."""
    value = conf.get("preblocks")
    if not flat_preblocks(value):
        return dict(value or {})
    concat = any(block.get("type") == "concat" for block in value.values())
    return {"per_step": {**value, **({} if concat else {"concat": {"type": "concat"}})}}


def preblocks(value: Any, conf: Mapping[str, Any]):
    """CREDIT's `preblocks.per_step`: a normaliser (era5_normalizer: mean/std files, positional
    levels; or bridgescaler_transform: a bridgescaler file), then concat; `to_device` moves the
    tensors, which this project's loader does."""
    flat = flat_preblocks(value)
    value = preblock_sections({"preblocks": value})
    extra = sorted(set(value) - set(PREBLOCK_SECTIONS))
    if extra:
        return (f"preblocks.{extra[0]}: CREDIT's preblocks sections are ic_only and per_step (CREDIT's build_preblocks "
                "refuses any other)")
    if value.get("ic_only"):
        return f"preblocks.ic_only: {sorted(dict(value['ic_only']))}; initial-condition-only preblocks are not read"
    pairs: list[tuple[str, Any]] = []
    kinds = []
    transforms = []
    for name, block in dict(value.get("per_step") or {}).items():
        kind = dict(block or {}).get("type")
        args = dict(dict(block or {}).get("args") or {})
        if kind == "to_device":
            continue
        if POINTWISE.get(kind) == "preblocks":
            where = f"preblocks.per_step.{name}"
            noop = selects_nothing(where, kind, args, source_var_keys(conf))
            if noop:
                pairs.append((None, noop))
                continue
            if kinds:
                return (f"{where}: a {kind} after the {kinds[0]} would act on normalised values; pointwise "
                        "preblocks are read before the normaliser (the order CREDIT's examples give them)")
            found = pointwise(where, kind, args, source_var_keys(conf))
            if isinstance(found, str):
                return found
            transforms.append(found)
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
            return (f"preblocks.per_step.{name}.type: {kind!r}; log_transform, sqrt_transform, fill_values, "
                    "era5_normalizer (mean/std files), bridgescaler_transform, to_device and concat are read here")
    if kinds not in (["era5_normalizer", "concat"], ["bridgescaler_transform", "concat"]):
        return (f"preblocks.per_step: {kinds}; this project reads one normaliser (era5_normalizer or "
                "bridgescaler_transform) followed by concat (CREDIT's ERA5 examples)")
    migrated = [(READ_OTHERWISE, "preblocks: blocks by name, CREDIT's layout before its ic_only and per_step "
                                 "sections; read as per_step with concat last, as CREDIT then ran them (its "
                                 "build_preblocks now refuses the layout and asks for that migration)")]
    return pairs + [("data.credit.transforms", transforms)] * bool(transforms) + migrated * flat


_POINTWISE_KIND = {"log_transform": "log", "sqrt_transform": "sqrt", "fill_values": "fill", "exp_transform": "exp",
                   "square_transform": "square"}
_COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")


def pointwise(where: str, kind: str, args: Mapping[str, Any], keys: Mapping[str, str]) -> dict | str:
    """A pointwise block's entry of `data.credit.transforms` / `output_inverse` ({kind,
    variables, base, eps}; credit/interop/pointwise_blocks.py), or a refusal naming the key.
    `keys`: the var keys the block can select (a postblock: the outputs)."""
    short = _POINTWISE_KIND[kind]
    allowed = {"variables"} | ({"base", "eps"} if short in ("log", "exp") else set()) | ({"rules"} if short == "fill" else set())
    allowed |= {"data_types"} if POINTWISE[kind] == "preblocks" else {"key"}
    extra = sorted(set(args) - allowed)
    if extra:
        return f"{where}.args.{extra[0]}: not an argument of CREDIT's {kind}"
    if sorted(args.get("data_types") or ["input", "target"]) != ["input", "target"]:
        return (f"{where}.args.data_types: {list(args['data_types'])}; inputs and targets are transformed alike "
                "here (CREDIT's default)")
    base = str(args.get("base", "e"))
    if base not in ("e", "2", "10"):
        return f"{where}.args.base: {args['base']!r}; CREDIT's bases are e, 2 and 10 (it raises on others)"
    eps = float(args.get("eps", 1e-8))
    if short in ("log", "exp") and not eps > 0:
        return f"{where}.args.eps: {args['eps']!r}; must be > 0 (log(eps) is taken)"
    entry = {"kind": short, "variables": selected(args.get("variables"), keys), "base": base, "eps": eps}
    if short == "fill":
        rules = _fill_rules(where, args.get("rules"))
        if isinstance(rules, str):
            return rules
        entry["rules"] = rules
    return entry


def _fill_rules(where: str, rules: Any) -> list[dict] | str:
    """fill_values' rules as `data.credit.transforms` holds them (search None: NaN), or the
    refusal of what CREDIT's FillValues raises on."""
    if not isinstance(rules, list) or not rules:
        return f"{where}.args.rules: {rules!r}; a list of rules {{search, fill[, op]}} (CREDIT's fill_values)"
    out = []
    for i, rule in enumerate(rules):
        rule = dict(rule or {})
        if "search" not in rule or "fill" not in rule or sorted(set(rule) - {"search", "op", "fill"}):
            return f"{where}.args.rules[{i}]: {rule}; each rule has search and fill (and op), as CREDIT requires"
        search, op = rule["search"], rule.get("op", "==")
        if search != "nan" and (isinstance(search, bool) or not isinstance(search, (int, float))):
            return f"{where}.args.rules[{i}].search: {search!r}; 'nan' or a number (CREDIT raises on others)"
        if op not in _COMPARISONS:
            return f"{where}.args.rules[{i}].op: {op!r}; one of {', '.join(_COMPARISONS)} (CREDIT raises on others)"
        out.append({"search": None if search == "nan" else float(search), "op": op, "fill": float(rule["fill"])})
    return out


def preblock_scaler(conf: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The args of the config's `bridgescaler_transform` preblock, if it has one."""
    blocks = dict(preblock_sections(conf).get("per_step") or {})
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
    if spatial_selection(args, outputs) != spatial_selection(pre, outputs):
        return (f"{where}.args.spatial_variables: {args.get('spatial_variables')!r}; the inverse must scale per grid "
                f"point exactly the output variables the preblock did ({spatial_selection(pre, outputs)})")
    return None


def postblocks(value: Any, conf: Mapping[str, Any]):
    """CREDIT's `postblocks`: `reconstruct` hands the prediction (or with in_key y, the target) on
    as this project does; a `bridgescaler_transform` inverse puts it in physical units, which the
    data's target statistics do here (rollout; the loss with `loss.type: base`); exp_transform
    and square_transform after it are `data.credit.output_inverse`."""
    value = dict(value or {})
    inverse_files = set()
    ignored = []
    outputs = {k: v for k, v in source_var_keys(conf).items() if k.split("/")[1] in ("prognostic", "diagnostic")}
    scaled_keys: set[str] = set()  # the keys an inverse scaler has de-normalised so far
    inverses: dict[str, list[dict]] = {"y_processed": [], "y_target_processed": []}
    computed: dict[str, tuple[str, dict]] = {}  # key -> (where, its geopotential_diagnostic's section)
    for section, blocks in value.items():
        for name, block in dict(blocks or {}).items():
            kind = dict(block or {}).get("type")
            args = dict(dict(block or {}).get("args") or {})
            where = f"postblocks.{section}.{name}"
            noop = selects_nothing(where, kind, args, outputs) if POINTWISE.get(kind) == "postblocks" else None
            if noop:
                ignored.append((None, noop))
            elif POINTWISE.get(kind) == "postblocks" and section == "per_step":
                key = args.get("key", "y_processed")
                if key not in inverses:
                    return f"{where}.args.key: {key!r}; the prediction (y_processed) and its target twin are read here"
                if key not in scaled_keys:
                    return (f"{where}: a {kind} of {key} before an inverse scaler acts on normalised values; it is "
                            "read after the bridgescaler_transform inverse of the same key")
                if key in computed:
                    return (f"{where}: a {kind} of {key} after its geopotential_diagnostic; the geopotential is "
                            "computed here from the outputs in physical units, after every pointwise postblock")
                found = pointwise(where, kind, args, outputs)
                if isinstance(found, str):
                    return found
                inverses[key].append(found)
            elif kind == "bridgescaler_transform" and section == "per_step":
                refusal = _inverse_scaler(where, args, conf)
                if refusal:
                    return refusal
                inverse_files.add(expand(str(args["scaler_path"])))
                scaled_keys.add(args.get("key", "y_processed"))
            elif kind == "geopotential_diagnostic" and section == "per_step":
                key = args.get("key", "y_processed")
                if key not in inverses or key not in scaled_keys or key in computed:
                    return (f"{where}.args.key: {key!r}; one geopotential_diagnostic of the prediction (y_processed) "
                            "and one of its target twin are read here, each after the inverse scaler of its key")
                found = geopotential_section(where, args, source_var_keys(conf))
                if isinstance(found, str):
                    return found
                computed[key] = (where, found)
            elif kind == "reconstruct":
                pair = (args.get("in_key", "y_pred"), args.get("out_key", "y_processed"))
                if pair not in (("y_pred", "y_processed"), ("y", "y_target_processed")):
                    return (f"{where}.args: in_key {pair[0]!r}, out_key {pair[1]!r}; the prediction "
                            "(y_pred -> y_processed) and its target twin (y -> y_target_processed) are read here")
            else:
                return (f"{where}.type: {kind!r}; reconstruct, the per_step bridgescaler_transform inverse, "
                        "exp_transform, square_transform and geopotential_diagnostic are read here (conservation "
                        "fixers: model.post_conf)")
    if len(inverse_files) > 1:
        return (f"postblocks.per_step: inverse scalers of {len(inverse_files)} files; the prediction and its target "
                "twin are de-normalised with one here")
    physical_loss = dict(conf.get("loss") or {}).get("type") == "base"
    if physical_loss and inverses["y_target_processed"] != inverses["y_processed"]:
        return ("postblocks.per_step: the target twin (y_target_processed) takes other exp/square blocks than the "
                f"prediction ({inverses['y_target_processed']} vs {inverses['y_processed']}); loss.type: base "
                "compares the two, so here they take the same")
    pairs = [*ignored, *(("data.credit.files.bridgescaler_inverse", f) for f in inverse_files)]
    scored = _scored_geopotential(computed, conf)
    if isinstance(scored, str):
        return scored
    pairs += scored
    return pairs + [("data.credit.output_inverse", inverses["y_processed"])] * bool(inverses["y_processed"])


def _scored_geopotential(computed: Mapping[str, tuple[str, dict]], conf: Mapping[str, Any]) -> list | str:
    """The geopotential postblocks' pairs: `data.credit.geopotential` when BaseLoss scores it
    (loss.type base, include_computed_diagnostics, the target twin computing the same), else the
    reason nothing uses it; or a refusal."""
    if not computed:
        return []
    where, section = computed.get("y_processed") or computed["y_target_processed"]
    args = dict(dict(conf.get("loss") or {}).get("args") or {})
    if dict(conf.get("loss") or {}).get("type") != "base" or not args.get("include_computed_diagnostics", True):
        return [(None, f"{where}: computes a geopotential that no loss scores here (CREDIT's BaseLoss scores "
                       "it with loss.args.include_computed_diagnostics); forecasts hold the outputs only")]
    if set(computed) != {"y_processed", "y_target_processed"} or \
            computed["y_processed"][1] != computed["y_target_processed"][1]:
        return (f"{where}: loss.args.include_computed_diagnostics scores the computed geopotential against its "
                "target twin's: give the prediction (y_processed) and the target (y_target_processed) one "
                "geopotential_diagnostic each, with the same arguments but key")
    return [("data.credit.geopotential", section)]


def inference(value: Any, conf: Mapping[str, Any]):
    """CREDIT's gen2 `inference` (credit.interop.config_gen2.inference), whose `postblocks` must
    de-normalise forecasts as the training postblocks do: forecasts here take the latter's
    inverse scaler and exp/square blocks."""
    pairs = config_gen2.inference(value, conf)
    blocks = dict(value or {}).get("postblocks")
    if isinstance(pairs, str) or not blocks:
        return pairs
    training = _forecast_inverse(dict(conf.get("postblocks") or {}), conf)
    forecast = _forecast_inverse(dict(blocks), conf)
    if isinstance(forecast, str):
        return f"inference.{forecast}"
    if not isinstance(training, str) and forecast != training:
        return (f"inference.postblocks: de-normalise forecasts otherwise than the training postblocks (inverse "
                f"scaler file, exp/square blocks: {forecast} vs {training}); forecasts here take the training "
                "postblocks' inverse")
    return pairs


def _forecast_inverse(value: Mapping[str, Any], conf: Mapping[str, Any]) -> tuple | str:
    """(the inverse scaler file, the prediction's exp/square blocks) of a postblocks section, or
    its refusal line."""
    found = postblocks(value, {key: v for key, v in conf.items() if key != "loss"})
    if isinstance(found, str):
        return found
    pairs = dict(p for p in found if p[0] is not None)
    return pairs.get("data.credit.files.bridgescaler_inverse"), pairs.get("data.credit.output_inverse", [])
