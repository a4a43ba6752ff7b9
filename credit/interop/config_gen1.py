"""The converters of CREDIT's data, trainer, loss and predict values that the mapping table
(`credit.interop.config_file.TABLE`) names: each takes (the key's value, the whole CREDIT
config) and returns this project's (key, value) pairs, or a refusal line naming the key.
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from credit.interop.paths import expand

Convert = Callable[[Any, Mapping[str, Any]], "list[tuple[str, Any]] | str"]

READ_OTHERWISE = "~read otherwise"
"""The key of a converter's pair (READ_OTHERWISE, "KEY: why") for a part of a file that is read
here otherwise than CREDIT's own code runs it (where that code would fail, or train NaN): one
warning line at the start of a run."""


def years(key: str) -> Convert:
    def convert(value: Any, conf: Mapping[str, Any]):
        try:
            first, last = (int(v) for v in value)  # CREDIT's last year is exclusive
        except (TypeError, ValueError):  # e.g. dates, as CREDIT's ocean (samudra) dataset reads them
            return f"data.{key}: {value!r}; CREDIT's ERA5 datasets read [first year, end year] as two integers"
        if last <= first:
            return f"data.{key}: {list(value)} holds no year (CREDIT's end year is exclusive)"
        return [(f"data.{'train' if key == 'train_years' else 'valid'}_period", [f"{first}-01-01", f"{last - 1}-12-31"])]

    return convert


def levels(value: Any, conf: Mapping[str, Any]):
    """data.levels from the upper-air files' level coordinate (CREDIT reads them in file order)."""
    data = conf.get("data", {})
    found = sorted(glob.glob(expand(data.get("save_loc", ""))))
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


def forecast_len(value: Any, conf: Mapping[str, Any]):
    # CREDIT counts 0 for one step; its trainer backpropagates each step's loss: their sum.
    # Validation rolls out as many steps when valid_forecast_len is absent (CREDIT's parser).
    pairs = [("data.forecast_len", int(value) + 1), ("trainer.loss.forecast_steps", "sum")]
    if (conf.get("data") or {}).get("valid_forecast_len") is None:
        pairs.append(("data.valid_forecast_len", int(value) + 1))
    return pairs


def valid_forecast_len(value: Any, conf: Mapping[str, Any]):
    # validation's lead: CREDIT rolls out valid_forecast_len + 1 steps and scores the last
    return [] if value is None else [("data.valid_forecast_len", int(value) + 1)]


def same_as(other: str) -> Convert:
    def convert(value: Any, conf: Mapping[str, Any]):
        section, key = other.split(".")
        if value is not None and value != conf.get(section, {}).get(key, value):
            return f"{section}.valid_{key}: {value} differs from {other}; validation here uses {other}"
        return []

    return convert


# scaler types CREDIT's gen1 trainer reads (credit/transforms at 5e14b83c) that this project does not:
# it refuses any other value itself ('std', of the older configs, is among them)
CREDIT_SCALERS = ("std_cached", "quantile-cached", "bridgescaler", "std-les", "std-wrf")


def scaler(value: Any, conf: Mapping[str, Any]):
    if value == "std_new":
        return []
    if value in CREDIT_SCALERS:
        return f"data.scaler_type: {value!r}; only 'std_new' (mean_path/std_path z-scores) is read here"
    return (f"data.scaler_type: {value!r}; CREDIT's own trainer refuses it too (its scaler types: 'std_new', "
            f"{', '.join(repr(s) for s in CREDIT_SCALERS)}); 'std_new' is its z-score scaler")


def mode(value: Any, conf: Mapping[str, Any]):
    parallel = {"none": "none", "ddp": "ddp", "fsdp": "fsdp2"}
    if value in ("domain_parallel", "fsdp+domain_parallel"):
        # CREDIT converts its convolutions and group norms to exchange halos, and leaves
        # attention "local within shard": a long-distance window then gathers rows spaced over
        # the shard, not the globe, so the model differs from its one-GPU self
        return (f"trainer.mode: {value!r}; CREDIT's domain parallelism computes long-distance attention "
                f"within each shard, another model than its one-GPU run; here sequence parallelism splits "
                f"the grid with the one-GPU arithmetic: trainer.mode: ddp (or fsdp) and "
                f"trainer.parallelism.sequence_parallel=true with trainer.parallelism.tensor=N")
    if value not in parallel:
        return f"trainer.mode: {value!r}; allowed: none, ddp, fsdp"
    return [("trainer.parallelism.data", parallel[value])]


# CREDIT's deterministic ERA5 trainers. Older gen1 configs name them as CREDIT did before its
# registry took today's names: 'standard' (the v1 ERA5 trainer) and 'universal' (CREDIT's own
# `credit convert` maps both to the ERA5 trainer), and 'multi-step', which named the same
# gradient-accumulating multi-step class as 'universal' until that class became era5-gen1's
# (the arXiv 2024 configs use 'standard' and 'multi-step')
ERA5_TRAINERS = ("era5-gen1", "era5", "standard", "universal", "multi-step", "cam", "gen2", "era5-gen2")


def trainer_type(value: Any, conf: Mapping[str, Any]):
    return [] if value in ERA5_TRAINERS else (
        f"trainer.type: {value!r}; this project trains CREDIT's deterministic ERA5 trainers "
        f"({', '.join(ERA5_TRAINERS)})")


def steps(value: Any, conf: Mapping[str, Any]):
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


def grad_max_norm(value: Any, conf: Mapping[str, Any]):
    if value == "dynamic":  # CREDIT: sqrt of the sum over ranks of each rank's norm
        return [("trainer.grad_clip_dynamic", True)]
    if value is None or float(value) == 0:
        return "trainer.grad_max_norm: unset or 0 makes CREDIT's gen1 trainer fail at its first step; give a number"
    return [("trainer.grad_clip", float(value))]


def mixed_precision(value: Any, conf: Mapping[str, Any]):
    trainer = conf.get("trainer", {})
    if not trainer.get("use_mixed_precision"):
        return []
    mp = trainer.get("mixed_precision") or {}
    if mp.get("param_dtype") == "bfloat16" and mp.get("reduce_dtype", "float32") == "float32":
        return [("trainer.parallelism.mixed_precision", "bf16")]
    return (f"trainer.mixed_precision: {dict(mp)}; this project's mixed precision is bf16 parameters with "
            "float32 reduction (param_dtype: bfloat16, reduce_dtype: float32)")


def scheduler_kind(conf: Mapping[str, Any]) -> str | None:
    trainer = conf.get("trainer", {})
    return dict(trainer.get("scheduler") or {}).get("scheduler_type") if trainer.get("use_scheduler") else None


def learning_rate(value: Any, conf: Mapping[str, Any]):
    if scheduler_kind(conf) == "cosine-annealing-restarts":
        return []  # CREDIT's restarts scheduler sets the lr itself (its max_lr)
    return [("trainer.optimizer.lr", float(value))]


def scheduler(value: Any, conf: Mapping[str, Any]):
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


ENSEMBLE_LOSSES = {"KCRPS": "kcrps", "almost-fair-crps": "almost_fair_crps"}
"""CREDIT's CRPS losses over members on the batch axis, by their names here."""


def training_loss(value: Any, conf: Mapping[str, Any]):
    from credit.config.validate import LOSS_FUNCTIONS

    members = int(dict(conf.get("trainer") or {}).get("ensemble_size") or 1)
    if value == "KCRPS" and members < 2:  # the one-member limit: the CRPS of a point forecast
        return [("trainer.loss.function", "mae"),
                (READ_OTHERWISE, "loss.training_loss: 'KCRPS' with trainer.ensemble_size 1 trains the CRPS of one "
                                 "member, its absolute error (mae); CREDIT's KCRPS divides 0 by m (m - 1) = 0 there and "
                                 "its loss is NaN from the first step")]
    if value in ENSEMBLE_LOSSES:
        if members < 2:
            return (f"loss.training_loss: {value!r} with trainer.ensemble_size {members}: a CRPS over one member "
                    "divides by m (m - 1) = 0 (CREDIT's almost-fair CRPS asserts there; its gen2 trainer refuses "
                    "it); set trainer.ensemble_size >= 2")
        return [("trainer.loss.function", ENSEMBLE_LOSSES[value])]
    if value == "ring-crps":  # CREDIT: one member per data-parallel rank, ensemble_size = those ranks
        if members < 2:
            return (f"loss.training_loss: 'ring-crps' with trainer.ensemble_size {members}: CREDIT puts one member "
                    "on each data-parallel rank and refuses a size other than their number; set "
                    "trainer.ensemble_size >= 2")
        # its ring exchange's gradient is the fair CRPS's: here the members' ensemble axis, one a rank
        return [("trainer.loss.function", "almost_fair_crps"), ("trainer.parallelism.ensemble", members)]
    if value not in LOSS_FUNCTIONS:
        return (f"loss.training_loss: {value!r}; CREDIT's losses read here: {', '.join(LOSS_FUNCTIONS)}, "
                f"and with trainer.ensemble_size > 1 {', '.join(ENSEMBLE_LOSSES)}")
    if members > 1:
        return (f"trainer.ensemble_size: {members} with loss.training_loss {value!r}; an ensemble trains with "
                f"{' or '.join(ENSEMBLE_LOSSES)} (CREDIT refuses it too)")
    return [("trainer.loss.function", value)]


def loss_parameters(value: Any, conf: Mapping[str, Any]):
    value = dict(value or {})
    read = {"delta", "alpha"} if dict(conf.get("loss") or {}).get("training_loss") == "almost-fair-crps" else {"delta"}
    unknown = sorted(set(value) - read)
    if unknown:
        return (f"loss.training_loss_parameters: {unknown}; only huber's delta and almost-fair-crps's alpha are "
                "read here")
    pairs = [("trainer.loss.huber_delta", float(value["delta"]))] if "delta" in value else []
    return pairs + ([("trainer.loss.crps_alpha", float(value["alpha"]))] if "alpha" in value else [])


def variable_weights(value: Any, conf: Mapping[str, Any]):
    loss = conf.get("loss", {})
    if not loss.get("use_variable_weights"):
        return []
    weights = dict(loss.get("variable_weights") or {})  # one `+` override per variable: the dict starts empty
    data = conf.get("data") or {}
    if data:  # CREDIT's parser keeps the weights of the output variables only
        from credit.interop.config_gen2 import is_gen2, output_variables

        outputs = output_variables(conf) if is_gen2(conf) else {
            *(data.get("variables") or []), *(data.get("surface_variables") or []),
            *(data.get("diagnostic_variables") or [])}
        weights = {name: value for name, value in weights.items() if name in outputs}
    return [*((f"+trainer.loss.variable_weights.{name}", value) for name, value in weights.items()),
            ("trainer.loss.normalize_variable_weights", False)]


def predict(value: Any, conf: Mapping[str, Any]):
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
        pairs.append(("rollout.output_dir", expand(value["save_forecast"])))
    members = int(value.get("ensemble_size") or 1)
    if members > 1:  # CREDIT's rollout repeats each initial state per member
        pairs.append(("rollout.members", members))
    return pairs


def load_weights(value: Any, conf: Mapping[str, Any]):
    """CREDIT's trainer reloads `save_loc/checkpoint.pt`: weights, with load_optimizer its AdamW
    state, with reload_epoch its epoch and schedule (`credit.interop.training_state`); in
    `trainer.mode: fsdp` the weights and AdamW state from its FSDP files beside it
    (model_checkpoint.pt, optimizer_checkpoint.pt)."""
    if not value:
        return []
    trainer = conf.get("trainer", {})
    pairs = [("trainer.credit_start.checkpoint", str(Path(expand(conf.get("save_loc", "."))) / "checkpoint.pt")),
             ("trainer.credit_start.optimizer", bool(trainer.get("load_optimizer", False))),
             ("trainer.credit_start.reload_epoch", bool(trainer.get("reload_epoch", False)))]
    return pairs + ([("trainer.credit_start.fsdp", True)] if trainer.get("mode") == "fsdp" else [])


def ensemble(value: Any, conf: Mapping[str, Any]):
    """Members on the batch axis, as CREDIT's trainers put them (its loss rule checks the pair)."""
    members = int(value or 1)
    if members < 1:
        return f"trainer.ensemble_size: {value}; must be >= 1"
    return [("trainer.ensemble_size", members)] if members > 1 else []
