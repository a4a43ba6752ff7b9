"""A CREDIT config file's `data:`, `trainer:`, `loss:` and top-level keys -> this project's
overrides: the one table of that mapping (`TABLE`). The `model:` section has its own reader
(`credit.models.credit_config`).

Each CREDIT key is mapped (to the key of this project named in its row), ignored with one
report line (CREDIT ignores it too, or it only steers CREDIT's own machinery), or refused with
one line (CREDIT acts on it and this project does not, yet). A key the table does not name is
one CREDIT's parser does not read: ignored. Only the gen1 schema is read here; a gen2 data
section (`data.source`) is refused in one line.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

Convert = Callable[[Any, Mapping[str, Any]], "list[tuple[str, Any]] | str"]


@dataclass(frozen=True)
class Rule:
    """One CREDIT key: `convert(value, whole config)` returns this project's (key, value)
    pairs, or a refusal line; `note` says why a key with no conversion is ignored."""

    key: str
    convert: Convert | None = None
    note: str = ""


def _to(*keys: str, fn: Callable[[Any], Any] = lambda v: v) -> Convert:
    return lambda value, conf: [(k, fn(value)) for k in keys]


def _refuse_if(active: Callable[[Any], bool], line: str, keys: tuple[str, ...] = (),
               fn: Callable[[Any], Any] = lambda v: v) -> Convert:
    return lambda value, conf: line if active(value) else [(k, fn(value)) for k in keys]


def _expand(path: Any) -> str:
    return os.path.expanduser(os.path.expandvars(str(path)))


def _years(key: str) -> Convert:
    def convert(value: Any, conf: Mapping[str, Any]):
        first, last = (int(v) for v in value)  # CREDIT's last year is exclusive
        if last <= first:
            return f"data.{key}: {list(value)} holds no year (CREDIT's end year is exclusive)"
        return [(f"data.{'train' if key == 'train_years' else 'valid'}_period", [f"{first}-01-01", f"{last - 1}-12-31"])]

    return convert


def _levels(value: Any, conf: Mapping[str, Any]):
    """data.levels from the upper-air files' level coordinate (CREDIT reads them in file order)."""
    data = conf.get("data", {})
    found = sorted(glob.glob(_expand(data.get("save_loc", ""))))
    if not found and data.get("level_ids"):  # `credit check` away from the data: the config's own list
        return [("data.levels", [float(v) for v in data["level_ids"]])]
    if not found:
        return f"data.save_loc: {data.get('save_loc')!r} matches no file (the levels are read from it)"
    from credit.data.catalog import open_store  # the data layer, read here for one coordinate

    with open_store(Path(found[0]), cache=False) as ds:
        if "level" not in ds.coords and "level" not in ds.dims:
            return f"data.save_loc: {found[0]} has no `level` coordinate"
        levels = [float(v) for v in np.asarray(ds["level"].values)]
    if value is not None and int(value) != len(levels):
        return f"data.levels: {value}, but {found[0]} holds {len(levels)} levels"
    return [("data.levels", levels)]


def _forecast_len(value: Any, conf: Mapping[str, Any]):
    return [("data.forecast_len", int(value) + 1)]  # CREDIT counts 0 for one step


def _same_as(other: str) -> Convert:
    def convert(value: Any, conf: Mapping[str, Any]):
        section, key = other.split(".")
        if value is not None and value != conf.get(section, {}).get(key, value):
            return f"{section}.valid_{key}: {value} differs from {other}; validation here uses {other}"
        return []

    return convert


def _scaler(value: Any, conf: Mapping[str, Any]):
    return [] if value == "std_new" else (f"data.scaler_type: {value!r}; only 'std_new' (mean_path/std_path "
                                          "z-scores) is read here")


def _mode(value: Any, conf: Mapping[str, Any]):
    parallel = {"none": "none", "ddp": "ddp", "fsdp": "fsdp2"}
    if value not in parallel:
        return f"trainer.mode: {value!r}; allowed: none, ddp, fsdp"
    return [("trainer.parallelism.data", parallel[value])]


def _trainer_type(value: Any, conf: Mapping[str, Any]):
    return [] if value in ("era5-gen1", "era5", "cam") else (
        f"trainer.type: {value!r}; this project trains CREDIT's deterministic ERA5 trainer (era5-gen1, era5)")


def _steps(value: Any, conf: Mapping[str, Any]):
    trainer = conf.get("trainer", {})
    per_epoch = int(trainer.get("batches_per_epoch") or 0)
    if per_epoch <= 0:  # a full pass per epoch: resolved from the training set at the run's global batch
        pairs = [("trainer.epochs", int(trainer.get("epochs", 1)))]
        if trainer.get("num_epoch"):
            pairs.append(("trainer.epochs_per_job", min(int(trainer["num_epoch"]), int(trainer.get("epochs", 1)))))
        return pairs
    pairs = [("trainer.max_steps", int(trainer.get("epochs", 1)) * per_epoch)]
    if trainer.get("num_epoch"):
        pairs.append(("trainer.steps_per_job", min(int(trainer["num_epoch"]), int(trainer.get("epochs", 1)))
                      * per_epoch))
    return pairs


def _grad_max_norm(value: Any, conf: Mapping[str, Any]):
    if value == "dynamic":  # CREDIT: sqrt of the sum over ranks of each rank's norm
        return [("trainer.grad_clip_dynamic", True)]
    if value is None or float(value) == 0:
        return "trainer.grad_max_norm: unset or 0 makes CREDIT's gen1 trainer fail at its first step; give a number"
    return [("trainer.grad_clip", float(value))]


def _mixed_precision(value: Any, conf: Mapping[str, Any]):
    trainer = conf.get("trainer", {})
    if not trainer.get("use_mixed_precision"):
        return []
    mp = trainer.get("mixed_precision") or {}
    if mp.get("param_dtype") == "bfloat16" and mp.get("reduce_dtype", "float32") == "float32":
        return [("trainer.parallelism.mixed_precision", "bf16")]
    return (f"trainer.mixed_precision: {dict(mp)}; this project's mixed precision is bf16 parameters with "
            "float32 reduction (param_dtype: bfloat16, reduce_dtype: float32)")


def _scheduler_kind(conf: Mapping[str, Any]) -> str | None:
    trainer = conf.get("trainer", {})
    return dict(trainer.get("scheduler") or {}).get("scheduler_type") if trainer.get("use_scheduler") else None


def _learning_rate(value: Any, conf: Mapping[str, Any]):
    if _scheduler_kind(conf) == "cosine-annealing-restarts":
        return []  # CREDIT's restarts scheduler sets the lr itself (its max_lr)
    return [("trainer.optimizer.lr", float(value))]


def _scheduler(value: Any, conf: Mapping[str, Any]):
    trainer = conf.get("trainer", {})
    if not value:  # a constant learning rate
        return [("trainer.scheduler.warmup_steps", 0), ("trainer.scheduler.min_lr_ratio", 1.0)]
    sched = dict(trainer.get("scheduler") or {})
    kind = sched.get("scheduler_type")
    lr = float(trainer.get("learning_rate", 1.0))
    if kind == "linear-warmup-cosine":
        return [("trainer.scheduler.warmup_steps", int(sched.get("warmup_steps", 1000))),
                ("trainer.scheduler.total_steps", int(sched.get("total_steps", 500_000))),
                ("trainer.scheduler.min_lr_ratio", min(1.0, float(sched.get("min_lr", 1e-5)) / lr)),
                ("trainer.scheduler.warmup_from_zero", True)]
    if kind == "cosine-annealing-restarts":
        peak = float(sched.get("max_lr", 0.1))
        return [("trainer.scheduler.type", "cosine_restarts"), ("trainer.optimizer.lr", peak),
                ("trainer.scheduler.first_cycle_steps", int(sched["first_cycle_steps"])),
                ("trainer.scheduler.cycle_mult", float(sched.get("cycle_mult", 1.0))),
                ("trainer.scheduler.gamma", float(sched.get("gamma", 1.0))),
                ("trainer.scheduler.warmup_steps", int(sched.get("warmup_steps", 0))),
                ("trainer.scheduler.min_lr_ratio", min(1.0, float(sched.get("min_lr", 0.001)) / peak))]
    if kind == "cosine-annealing":
        return [("trainer.scheduler.type", "epoch_cosine"), ("trainer.scheduler.t_max_epochs", int(sched["T_max"])),
                ("trainer.scheduler.min_lr_ratio", min(1.0, float(sched.get("eta_min", 0.0)) / lr))]
    if kind == "lambda":
        return [("trainer.scheduler.type", "epoch_lambda")]
    return (f"trainer.scheduler.scheduler_type: {kind!r} is not implemented (plateau steps on each epoch's "
            "validation metric); linear-warmup-cosine, cosine-annealing-restarts, cosine-annealing, lambda and "
            "use_scheduler: false are")


def _training_loss(value: Any, conf: Mapping[str, Any]):
    from credit.config.validate import LOSS_FUNCTIONS

    if value not in LOSS_FUNCTIONS:
        return (f"loss.training_loss: {value!r}; CREDIT's deterministic losses are read here "
                f"({', '.join(LOSS_FUNCTIONS)}); ensembles and CRPS losses are not")
    return [("trainer.loss.function", value)]


def _loss_parameters(value: Any, conf: Mapping[str, Any]):
    value = dict(value or {})
    unknown = sorted(set(value) - {"delta"})
    if unknown:
        return f"loss.training_loss_parameters: {unknown}; only huber's delta is read here"
    return [("trainer.loss.huber_delta", float(value["delta"]))] if "delta" in value else []


def _variable_weights(value: Any, conf: Mapping[str, Any]):
    loss = conf.get("loss", {})
    if not loss.get("use_variable_weights"):
        return []
    weights = dict(loss.get("variable_weights") or {})  # one `+` override per variable: the dict starts empty
    data = conf.get("data") or {}
    if data:  # CREDIT's parser keeps the weights of the output variables only
        outputs = {*(data.get("variables") or []), *(data.get("surface_variables") or []),
                   *(data.get("diagnostic_variables") or [])}
        weights = {name: value for name, value in weights.items() if name in outputs}
    return [*((f"+trainer.loss.variable_weights.{name}", value) for name, value in weights.items()),
            ("trainer.loss.normalize_variable_weights", False)]


def _predict(value: Any, conf: Mapping[str, Any]):
    """CREDIT's `predict.forecasts` (`credit/forecast.py`'s init times and lengths) and
    `save_forecast` -> `rollout.init_times`, `rollout.lead_steps`, `rollout.output_dir`."""
    value = dict(value or {})
    step_h = int((conf.get("data") or {}).get("lead_time_periods", 1))
    forecasts = value.get("forecasts")
    pairs: list[tuple[str, Any]] = []
    if isinstance(forecasts, Mapping):
        kind = forecasts.get("type")
        if kind not in ("custom", "10day_year"):
            return f"predict.forecasts.type: {kind!r}; CREDIT's types are custom and 10day_year"
        days = 10 if kind == "10day_year" else int(forecasts.get("days", 10))
        duration = 365 if kind == "10day_year" else int(forecasts.get("duration", 365))
        interval = 1 if kind == "10day_year" else int(forecasts.get("ic_interval_days", 1))
        start = np.datetime64(f"{int(forecasts['start_year']):04d}-{int(forecasts['start_month']):02d}-"
                              f"{int(forecasts['start_day']):02d}", "h")
        hours = forecasts.get("start_hours", [0])
        hours = [hours] if isinstance(hours, int) else list(hours)
        inits = [start + np.timedelta64(24 * interval * i + int(h), "h") for i in range(duration // interval)
                 for h in hours]
        pairs += [("rollout.init_times", [str(t) + ":00" for t in inits]), ("rollout.lead_steps", days * 24 // step_h)]
    elif forecasts:  # CREDIT's explicit [start, end] pairs
        spans = [(np.datetime64(str(a).replace(" ", "T"), "m"), np.datetime64(str(b).replace(" ", "T"), "m"))
                 for a, b in forecasts]
        steps = {int((b - a) / np.timedelta64(step_h, "h")) + 1 for a, b in spans}
        if len(steps) != 1:
            return f"predict.forecasts: the forecasts differ in length ({sorted(steps)} steps); give one length"
        pairs += [("rollout.init_times", [str(a) for a, _ in spans]), ("rollout.lead_steps", steps.pop())]
    if value.get("save_forecast"):
        pairs.append(("rollout.output_dir", _expand(value["save_forecast"])))
    return pairs


def _ensemble(value: Any, conf: Mapping[str, Any]):
    return f"trainer.ensemble_size: {value}; ensembles are not trained here" if int(value or 1) > 1 else []


_RUN_MACHINERY = "steers CREDIT's own run machinery"
TABLE: tuple[Rule, ...] = (
    Rule("save_loc", _to("run_dir", fn=_expand)),
    Rule("seed", _to("trainer.seed", fn=int)),
    Rule("pbs", note="CREDIT's PBS job script"),
    Rule("predict", _predict),
    # data
    Rule("data.variables", _to("data.variables.upper_air", fn=list)),
    Rule("data.save_loc", _to("data.credit.files.upper_air", fn=_expand)),
    Rule("data.surface_variables", _to("data.variables.surface", fn=lambda v: list(v or []))),
    Rule("data.save_loc_surface", _to("data.credit.files.surface", fn=_expand)),
    Rule("data.dynamic_forcing_variables", _to("data.variables.forcing", fn=lambda v: list(v or []))),
    Rule("data.save_loc_dynamic_forcing", _to("data.credit.files.dynamic_forcing", fn=_expand)),
    Rule("data.diagnostic_variables", _to("data.variables.diagnostic", fn=lambda v: list(v or []))),
    Rule("data.save_loc_diagnostic", _to("data.credit.files.diagnostic", fn=_expand)),
    Rule("data.forcing_variables", _to("data.credit.forcing_file_variables", fn=lambda v: list(v or []))),
    Rule("data.save_loc_forcing", _to("data.credit.files.forcing", fn=_expand)),
    Rule("data.static_variables", _to("data.variables.static", fn=lambda v: list(v or []))),
    Rule("data.save_loc_static", _to("data.credit.files.static", fn=_expand)),
    Rule("data.mean_path", _to("data.credit.files.mean", fn=_expand)),
    Rule("data.std_path", _to("data.credit.files.std", fn=_expand)),
    Rule("data.levels", _levels),
    Rule("data.level_ids", note="CREDIT's gen1 dataset reads the levels in file order, not these"),
    Rule("data.train_years", _years("train_years")),
    Rule("data.valid_years", _years("valid_years")),
    Rule("data.history_len", _to("data.history_len", fn=int)),
    Rule("data.valid_history_len", _same_as("data.history_len")),
    Rule("data.forecast_len", _forecast_len),
    Rule("data.valid_forecast_len", _refuse_if(lambda v: int(v or 0) != 0,
                                               "data.valid_forecast_len: validation here is one step (0)")),
    Rule("data.skip_periods", _to("data.credit.skip_periods", fn=lambda v: int(v or 1))),
    Rule("data.static_first", _to("data.credit.static_first", fn=bool)),
    Rule("data.data_clamp", _to("data.credit.clamp", fn=lambda v: None if v is None else [float(x) for x in v])),
    Rule("data.scaler_type", _scaler),
    Rule("data.lead_time_periods", note="the time step is the files' own"),
    Rule("data.dataset_type", note="CREDIT's gen1 dataset classes yield the same samples"),
    Rule("data.sst_forcing", note="CREDIT's multi-step batchers do not pass it on"),
    Rule("data.max_forecast_len", note="CREDIT's gen1 trainer does not read it"),
    Rule("data.total_time_steps", note="CREDIT's gen1 trainer does not read it"),
    Rule("data.one_shot", note="only CREDIT's deprecated single-step dataset reads it"),
    Rule("data.save_loc_physics", note="read with model.post_conf (credit.models.credit_config)"),
    Rule("data.retain_graph", _refuse_if(bool, "data.retain_graph: true (backpropagation through the forecast "
                                               "steps) is not implemented; each step's input is detached")),
    Rule("data.backprop_on_timestep", note="every forecast step's loss is backpropagated here"),
    # trainer
    Rule("trainer.mode", _mode),
    Rule("trainer.type", _trainer_type),
    Rule("trainer.learning_rate", _learning_rate),
    Rule("trainer.weight_decay", _to("trainer.optimizer.weight_decay", fn=float)),
    Rule("trainer.train_batch_size", _to("trainer.batch_size", fn=int)),
    Rule("trainer.valid_batch_size", note="validation runs at trainer.batch_size"),
    Rule("trainer.batches_per_epoch", _steps),
    Rule("trainer.epochs", note="with batches_per_epoch: trainer.max_steps"),
    Rule("trainer.num_epoch", note="with batches_per_epoch: trainer.steps_per_job"),
    Rule("trainer.start_epoch", note="a run resumes from its own checkpoints (trainer.resume)"),
    Rule("trainer.valid_batches_per_epoch", _to("data.valid_samples", fn=lambda v: max(1, int(v or 1)))),
    Rule("trainer.grad_accum_every", note="CREDIT's gen1 trainer does not read it"),
    Rule("trainer.grad_max_norm", _grad_max_norm),
    Rule("trainer.amp", _refuse_if(bool, "trainer.amp: true (float16 autocast with a gradient scaler) is not "
                                         "implemented; bf16 is: trainer.parallelism.mixed_precision=bf16")),
    Rule("trainer.use_mixed_precision", _mixed_precision),
    Rule("trainer.mixed_precision", note="read with use_mixed_precision"),
    Rule("trainer.activation_checkpoint", _to("trainer.parallelism.activation_checkpointing", fn=bool)),
    Rule("trainer.checkpoint_all_layers", note="every block is checkpointed here"),
    Rule("trainer.cpu_offload", _refuse_if(bool, "trainer.cpu_offload: true is not implemented")),
    Rule("trainer.compile", _refuse_if(bool, "trainer.compile: true is not implemented")),
    Rule("trainer.use_ema", _to("trainer.ema.enabled", fn=bool)),
    Rule("trainer.ema_decay", _to("trainer.ema.decay", fn=float)),
    Rule("trainer.use_scheduler", _scheduler),
    Rule("trainer.scheduler", note="read with use_scheduler"),
    Rule("trainer.load_weights", _refuse_if(bool, "trainer.load_weights: true (continuing from CREDIT's "
                                                  "checkpoint.pt) is not mapped yet; convert it with `credit "
                                                  "convert-checkpoint`")),
    Rule("trainer.load_optimizer", note="with load_weights"),
    Rule("trainer.load_scheduler", note="with load_weights"),
    Rule("trainer.load_scaler", note="with load_weights"),
    Rule("trainer.reload_epoch", note="with load_weights"),
    Rule("trainer.update_learning_rate", note="with load_weights"),
    Rule("trainer.ensemble_size", _ensemble),
    Rule("trainer.thread_workers", _to("data.num_workers", fn=lambda v: int(v or 0))),
    Rule("trainer.valid_thread_workers", note="validation reads in the training process"),
    Rule("trainer.prefetch_factor", note=_RUN_MACHINERY),
    Rule("trainer.skip_validation", note="validation runs every trainer.valid_every_n_steps"),
    Rule("trainer.save_best_weights", note=_RUN_MACHINERY),
    Rule("trainer.save_backup_weights", note=_RUN_MACHINERY),
    Rule("trainer.save_every_epoch", note=_RUN_MACHINERY),
    Rule("trainer.stopping_patience", note=_RUN_MACHINERY),
    Rule("trainer.training_metric", note=_RUN_MACHINERY),
    Rule("trainer.training_metric_direction", note=_RUN_MACHINERY),
    Rule("trainer.train_one_epoch", note=_RUN_MACHINERY),
    Rule("trainer.stop_after_epoch", note=_RUN_MACHINERY),
    Rule("trainer.use_tensorboard", note=_RUN_MACHINERY),
    # loss
    Rule("loss.training_loss", _training_loss),
    Rule("loss.training_loss_parameters", _loss_parameters),
    Rule("loss.validation_loss", note="validation reports the training loss and RMSE per variable"),
    Rule("loss.use_latitude_weights", _to("trainer.loss.latitude_weighting", fn=bool)),
    Rule("loss.latitude_weights", note="cos(latitude) / its mean, from the data's latitude, as CREDIT "
                                       "computes it from this file's"),
    Rule("loss.use_variable_weights", _variable_weights),
    Rule("loss.variable_weights", note="read with use_variable_weights"),
    Rule("loss.use_power_loss", _refuse_if(bool, "loss.use_power_loss: true; spectral and power losses are not "
                                                 "implemented")),
    Rule("loss.use_spectral_loss", _refuse_if(bool, "loss.use_spectral_loss: true; spectral and power losses "
                                                    "are not implemented")),
    Rule("loss.spectral_lambda_reg", note="with use_power_loss or use_spectral_loss"),
    Rule("loss.spectral_wavenum_init", note="with use_power_loss or use_spectral_loss"),
)
RULES = {rule.key: rule for rule in TABLE}
SECTIONS = ("data", "trainer", "loss")  # read key by key; `model` has its own reader


@dataclass
class CreditMapping:
    """What a CREDIT config file became: report lines, refusals, and hydra overrides."""

    lines: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def _override(key: str, value: Any) -> str:
    from credit.models.credit_config import hydra_value  # the one writer of override values

    return f"{key}={hydra_value(value)}"


def map_credit_file(conf: Mapping[str, Any]) -> CreditMapping:
    """Every key of `conf`'s data, trainer and loss sections and its top level (not `model`)."""
    out = CreditMapping()
    data = conf.get("data") or {}
    if isinstance(data, Mapping) and "source" in data:
        out.refused.append("data.source: CREDIT's gen2 data schema is not read yet; gen1 data sections are")
        out.lines.append(f"data.source: refused: {out.refused[0]}")
        return out
    if data:  # a model-only file keeps this project's data settings
        out.overrides += [_override("data.layout", "credit-gen1"), _override("data.generate_if_missing", False)]
    present = [key for key in conf if key not in (*SECTIONS, "model")]
    for section in SECTIONS:
        values = conf.get(section) or {}
        present += [f"{section}.{key}" for key in values]
    if isinstance(data, Mapping) and "levels" not in data and "variables" in data:
        present.append("data.levels")  # CREDIT's parser takes them from model.levels: read the files
    for key in present:
        section, _, name = key.rpartition(".")
        value = (conf.get(section) or {}).get(name) if section else conf.get(key)
        rule = RULES.get(key)
        if rule is None:
            out.ignored.append(key)
            out.lines.append(f"{key}: ignored, as CREDIT ignores it")
            continue
        if rule.convert is None and rule.note.startswith(("with ", "read with ")):
            out.lines.append(f"{key}: {rule.note}")  # another row's conversion reads it
            continue
        if rule.convert is None:
            out.ignored.append(key)
            out.lines.append(f"{key}: ignored ({rule.note})")
            continue
        result = rule.convert(value, conf)
        if isinstance(result, str):
            out.refused.append(result)
            out.lines.append(f"{key}: refused: {result}")
            continue
        out.overrides += [_override(k, v) for k, v in result]
        targets = ", ".join(_override(k, v) for k, v in result) or "(nothing to set: this project's default)"
        out.lines.append(f"{key} -> {targets}")
    if "root" not in " ".join(out.overrides):
        save_loc = data.get("save_loc") if isinstance(data, Mapping) else None
        if save_loc:
            out.overrides.append(_override("data.root", str(Path(_expand(save_loc)).parent)))
    return out
