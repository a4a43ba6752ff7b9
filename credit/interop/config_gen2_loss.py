"""CREDIT's gen2 loss object (`loss.type: base`, its BaseLoss and `loss.args`) as this project's
`trainer.loss` keys, for the mapping table (`credit.interop.config_file.TABLE`): takes (the
key's value, the whole CREDIT config) and returns (key, value) pairs, or a refusal line naming
the key. BaseLoss scores what the postblocks de-normalise (`config_gen2_blocks`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from credit.interop.config_gen2 import output_variables
from credit.interop.config_gen2_blocks import source_var_keys
from credit.interop.paths import expand


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
    overrides = _loss_overrides(dict(args.get("base_loss_overrides") or {}), conf)
    if isinstance(overrides, str):
        return overrides
    weighting = args.get("var_weighting", "inverse_variance")
    if weighting not in ("inverse_variance", "manual", "learnable", "none"):
        return (f"loss.args.var_weighting: {weighting!r}; one of inverse_variance, manual, learnable, none "
                "(CREDIT's BaseLoss)")
    post = dict(dict(conf.get("postblocks") or {}).get("per_step") or {})
    keys = {dict(dict(b or {}).get("args") or {}).get("key", "y_processed") for b in post.values()
            if dict(b or {}).get("type") == "bridgescaler_transform"}
    if keys != {"y_processed", "y_target_processed"}:
        return ("loss.type: base scores the postblocks' physical units: postblocks.per_step needs the "
                "bridgescaler_transform inverse of y_processed and of its target twin y_target_processed "
                "(CREDIT's BaseLoss)")
    inverse = {expand(str(dict(b.get("args") or {}).get("scaler_path"))) for b in post.values()
               if isinstance(b, Mapping) and b.get("type") == "bridgescaler_transform"}
    if weighting in ("inverse_variance", "learnable") and {expand(str(args.get("scaler_path")))} != inverse:
        return (f"loss.args.scaler_path: {args.get('scaler_path')!r}; {weighting} weights are read from the "
                "postblocks' bridgescaler file (the statistics that de-normalise the outputs)")
    outputs = output_variables(conf)
    names = source_var_keys(conf)
    weights = {names.get(k, k): float(w) for k, w in dict(args.get("variable_weights") or {}).items()}
    pairs: list[tuple[str, Any]] = [
        ("trainer.loss.function", function), ("trainer.loss.space", "physical"),
        ("trainer.loss.combine", "variables"), ("trainer.loss.inverse_variance", weighting == "inverse_variance"),
        ("trainer.loss.learnable_variance", weighting == "learnable"),
        ("trainer.loss.normalize_variable_weights", bool(args.get("normalize_weights", True))),
        ("trainer.loss.latitude_weighting", bool(args.get("use_latitude_weights", False))),
        *((f"+trainer.loss.variable_weights.{name}", w) for name, w in weights.items() if name in outputs)]
    if "delta" in params:
        pairs.append(("trainer.loss.huber_delta", float(params["delta"])))
    return pairs + overrides


def _loss_overrides(overrides: Mapping[str, Any], conf: Mapping[str, Any]) -> list[tuple[str, Any]] | str:
    """BaseLoss's `base_loss_overrides` ({var key: {loss, parameters}}) as
    `trainer.loss.overrides.<name>`, or the refusal naming the key."""
    from credit.config.validate import LOSS_FUNCTIONS

    outputs = {k: v for k, v in source_var_keys(conf).items() if k.split("/")[1] in ("prognostic", "diagnostic")}
    found = {}
    for key, spec in overrides.items():
        where = f"loss.args.base_loss_overrides.{key}"
        spec = dict(spec or {})
        if key not in outputs:
            return f"{where}: not an output variable's full key ({sorted(outputs)})"
        if sorted(set(spec) - {"loss", "parameters"}) or "loss" not in spec:
            return f"{where}: {spec}; an override is {{loss, parameters}}, as CREDIT's BaseLoss reads it"
        if spec["loss"] not in LOSS_FUNCTIONS:
            return (f"{where}.loss: {spec['loss']!r}; CREDIT's elementwise losses are read here "
                    f"({', '.join(LOSS_FUNCTIONS)}); a CRPS only as training_loss itself (CREDIT raises)")
        params = dict(spec.get("parameters") or {})
        if sorted(set(params) - {"delta"}):
            return f"{where}.parameters: {sorted(params)}; only huber's delta is read here"
        found[outputs[key]] = {"function": spec["loss"], "huber_delta": float(params.get("delta", 1.0))}
    return [(f"+trainer.loss.overrides.{name}", value) for name, value in found.items()]
