"""A CREDIT config file's `data:`, `trainer:`, `loss:` and top-level keys -> this project's
overrides: the one table of that mapping (`TABLE`). The `model:` section has its own reader
(`credit.models.credit.config`).

Each CREDIT key is mapped (to the key of this project named in its row), ignored with one
report line (CREDIT ignores it too, or it only steers CREDIT's own machinery), or refused with
one line (CREDIT acts on it and this project does not, yet). A key the table does not name is
one CREDIT's parser does not read: ignored. A row belongs to both schemas, or to gen1 or gen2
(`schema`): a config with `data.source` is gen2, where some gen1 keys mean something else or
nothing (CREDIT's gen2 trainer does not read them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from credit.interop import config_gen1 as cv
from credit.interop import config_gen2 as cvg
from credit.interop import config_gen2_blocks as cvb
from credit.interop import config_gen2_loss
from credit.interop.config_gen1 import READ_OTHERWISE, Convert


@dataclass(frozen=True)
class Rule:
    """One CREDIT key: `convert(value, whole config)` returns this project's (key, value)
    pairs, or a refusal line; `note` says why a key with no conversion is ignored. A pair
    (None, "KEY: why") names a part of the value CREDIT runs as a no-op: ignored, with the why; a
    pair (READ_OTHERWISE, "KEY: why") a part read otherwise than CREDIT's code runs it: a warning."""

    key: str
    convert: Convert | None = None
    note: str = ""
    schema: str = ""  # "" (both), gen1 or gen2


def _to(*keys: str, fn: Callable[[Any], Any] = lambda v: v) -> Convert:
    return lambda value, conf: [(k, fn(value)) for k in keys]


def _refuse_if(active: Callable[[Any], bool], line: str, keys: tuple[str, ...] = (),
               fn: Callable[[Any], Any] = lambda v: v) -> Convert:
    return lambda value, conf: line if active(value) else [(k, fn(value)) for k in keys]


_RUN_MACHINERY = "steers CREDIT's own run machinery"
TABLE: tuple[Rule, ...] = (
    Rule("save_loc", _to("run_dir", fn=cv.expand)),
    Rule("seed", _to("trainer.seed", fn=int)),
    Rule("pbs", note="CREDIT's PBS job script"),
    Rule("predict", cv.predict),
    # data
    Rule("data.variables", _to("data.variables.upper_air", fn=list), schema="gen1"),
    Rule("data.save_loc", _to("data.credit.files.upper_air", fn=cv.expand), schema="gen1"),
    Rule("data.surface_variables", _to("data.variables.surface", fn=lambda v: list(v or [])), schema="gen1"),
    Rule("data.save_loc_surface", _to("data.credit.files.surface", fn=cv.expand), schema="gen1"),
    Rule("data.dynamic_forcing_variables", _to("data.variables.forcing", fn=lambda v: list(v or [])), schema="gen1"),
    Rule("data.save_loc_dynamic_forcing", _to("data.credit.files.dynamic_forcing", fn=cv.expand), schema="gen1"),
    Rule("data.diagnostic_variables", _to("data.variables.diagnostic", fn=lambda v: list(v or [])), schema="gen1"),
    Rule("data.save_loc_diagnostic", _to("data.credit.files.diagnostic", fn=cv.expand), schema="gen1"),
    Rule("data.forcing_variables", _to("data.credit.forcing_file_variables", fn=lambda v: list(v or [])),
         schema="gen1"),
    Rule("data.save_loc_forcing", _to("data.credit.files.forcing", fn=cv.expand), schema="gen1"),
    Rule("data.static_variables", _to("data.variables.static", fn=lambda v: list(v or [])), schema="gen1"),
    Rule("data.save_loc_static", _to("data.credit.files.static", fn=cv.expand), schema="gen1"),
    Rule("data.mean_path", _to("data.credit.files.mean", fn=cv.expand), schema="gen1"),
    Rule("data.std_path", _to("data.credit.files.std", fn=cv.expand), schema="gen1"),
    Rule("data.levels", cv.levels, schema="gen1"),
    Rule("data.level_ids", note="CREDIT's gen1 dataset reads the levels in file order, not these", schema="gen1"),
    Rule("data.train_years", cv.years("train_years"), schema="gen1"),
    Rule("data.valid_years", cv.years("valid_years"), schema="gen1"),
    Rule("data.history_len", _to("data.history_len", fn=int)),
    Rule("data.valid_history_len", cv.same_as("data.history_len"), schema="gen1"),
    Rule("data.forecast_len", cv.forecast_len, schema="gen1"),
    Rule("data.valid_forecast_len", cv.valid_forecast_len, schema="gen1"),
    Rule("data.skip_periods", _to("data.credit.skip_periods", fn=lambda v: int(v or 1)), schema="gen1"),
    Rule("data.static_first", _to("data.credit.static_first", fn=bool), schema="gen1"),
    Rule("data.data_clamp", _to("data.credit.clamp", fn=lambda v: None if v is None else [float(x) for x in v])),
    Rule("data.scaler_type", cv.scaler, schema="gen1"),
    Rule("data.lead_time_periods", note="the time step is the files' own", schema="gen1"),
    Rule("data.dataset_type", note="CREDIT's gen1 dataset classes yield the same samples", schema="gen1"),
    Rule("data.sst_forcing", note="CREDIT's multi-step batchers do not pass it on", schema="gen1"),
    Rule("data.max_forecast_len", note="CREDIT's gen1 trainer does not read it", schema="gen1"),
    Rule("data.total_time_steps", note="CREDIT's gen1 trainer does not read it", schema="gen1"),
    Rule("data.one_shot", note="only CREDIT's deprecated single-step dataset reads it", schema="gen1"),
    Rule("data.save_loc_physics", note="read with model.post_conf (credit.models.credit.config)"),
    Rule("data.retain_graph", _refuse_if(bool, "data.retain_graph: true (backpropagation through the forecast "
                                               "steps) is not implemented; each step's input is detached")),
    Rule("data.backprop_on_timestep", note="every forecast step's loss is backpropagated here"),
    # trainer
    Rule("trainer.mode", cv.mode, schema="gen1"),
    Rule("trainer.type", cv.trainer_type),
    Rule("trainer.learning_rate", cv.learning_rate),
    Rule("trainer.weight_decay", _to("trainer.optimizer.weight_decay", fn=float)),
    Rule("trainer.train_batch_size", _to("trainer.batch_size", fn=int)),
    Rule("trainer.valid_batch_size", note="validation runs at trainer.batch_size"),
    Rule("trainer.batches_per_epoch", cv.steps),
    Rule("trainer.epochs", note="with batches_per_epoch: trainer.max_steps"),
    Rule("trainer.num_epoch", note="with batches_per_epoch: trainer.steps_per_job"),
    Rule("trainer.start_epoch", note="a run resumes from its own checkpoints (trainer.resume)"),
    Rule("trainer.valid_batches_per_epoch", _to("data.valid_samples", fn=lambda v: max(1, int(v or 1)))),
    Rule("trainer.grad_accum_every", note="CREDIT's gen1 trainer does not read it", schema="gen1"),
    Rule("trainer.grad_max_norm", cv.grad_max_norm, schema="gen1"),
    Rule("trainer.amp", _refuse_if(bool, "trainer.amp: true (float16 autocast with a gradient scaler) is not "
                                         "implemented; bf16 is: trainer.parallelism.mixed_precision=bf16")),
    Rule("trainer.use_mixed_precision", cv.mixed_precision, schema="gen1"),
    Rule("trainer.mixed_precision", note="read with use_mixed_precision", schema="gen1"),
    Rule("trainer.activation_checkpoint", _to("trainer.parallelism.activation_checkpointing", fn=bool)),
    Rule("trainer.checkpoint_all_layers", note="every block is checkpointed here", schema="gen1"),
    Rule("trainer.cpu_offload", _refuse_if(bool, "trainer.cpu_offload: true is not implemented"), schema="gen1"),
    Rule("trainer.compile", _refuse_if(bool, "trainer.compile: true is not implemented")),
    Rule("trainer.use_ema", _to("trainer.ema.enabled", fn=bool)),
    Rule("trainer.ema_decay", _to("trainer.ema.decay", fn=float)),
    Rule("trainer.use_scheduler", cv.scheduler),
    Rule("trainer.scheduler", note="read with use_scheduler"),
    Rule("trainer.load_weights", cv.load_weights),
    Rule("trainer.load_optimizer", note="read with load_weights"),
    Rule("trainer.load_scheduler", note="read with load_weights and reload_epoch: the schedule is a function of "
                                        "the step"),
    Rule("trainer.load_scaler", note="with load_weights: no float16 gradient scaler here (trainer.amp)"),
    Rule("trainer.reload_epoch", note="read with load_weights"),
    Rule("trainer.update_learning_rate", note="with load_weights: every step's lr is the schedule's"),
    Rule("trainer.ensemble_size", cv.ensemble),
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
    Rule("loss.training_loss", cv.training_loss),
    Rule("loss.training_loss_parameters", cv.loss_parameters),
    Rule("loss.validation_loss", note="validation reports the training loss and RMSE per variable"),
    Rule("loss.use_latitude_weights", _to("trainer.loss.latitude_weighting", fn=bool)),
    Rule("loss.latitude_weights", note="cos(latitude) / its mean, from the data's latitude, as CREDIT "
                                       "computes it from this file's"),
    Rule("loss.use_variable_weights", cv.variable_weights),
    Rule("loss.variable_weights", note="read with use_variable_weights"),
    Rule("loss.use_power_loss", _refuse_if(bool, "loss.use_power_loss: true; spectral and power losses are not "
                                                 "implemented")),
    Rule("loss.use_spectral_loss", _refuse_if(bool, "loss.use_spectral_loss: true; spectral and power losses "
                                                    "are not implemented")),
    Rule("loss.spectral_lambda_reg", note="with use_power_loss or use_spectral_loss"),
    Rule("loss.spectral_wavenum_init", note="with use_power_loss or use_spectral_loss"),
    # gen2 (data.source): credit/interop/config_gen2.py
    Rule("data.source", cvg.source, schema="gen2"),
    Rule("data.start_datetime", cvg.period("data", "data.train_period"), schema="gen2"),
    Rule("data.end_datetime", note="read with start_datetime", schema="gen2"),
    Rule("data.date_ranges", _refuse_if(bool, "data.date_ranges: not implemented; give start_datetime and "
                                              "end_datetime"), schema="gen2"),
    Rule("data.timestep", cvg.timestep, schema="gen2"),
    Rule("data.forecast_len", cvg.forecast_len, schema="gen2"),
    Rule("data.calendar", note="the files' standard calendar", schema="gen2"),
    Rule("data.lead_time_periods", note="the time step is data.timestep", schema="gen2"),
    *(Rule(f"data.{key}", note="CREDIT's gen2 trainer does not read it (normalisation is preblocks')",
           schema="gen2") for key in ("mean_path", "std_path", "scaler_type", "static_first")),
    *(Rule(f"data.{key}", note="CREDIT's gen2 trainer does not read it", schema="gen2")
      for key in ("one_shot", "skip_periods", "level_ids", "valid_history_len", "valid_forecast_len")),
    Rule("validation_data", cvg.validation_data, schema="gen2"),
    Rule("preblocks", cvb.preblocks, schema="gen2"),
    Rule("postblocks", cvb.postblocks, schema="gen2"),
    Rule("inference", cvb.inference, schema="gen2"),
    Rule("trainer.parallelism", cvg.parallelism, schema="gen2"),
    Rule("trainer.mode", note="trainer.parallelism replaces it in gen2", schema="gen2"),
    Rule("trainer.grad_max_norm", cvg.grad_max_norm, schema="gen2"),
    Rule("trainer.grad_accum_every", _to("trainer.grad_accum_steps", fn=lambda v: int(v or 1)), schema="gen2"),
    *(Rule(f"trainer.{key}", note="CREDIT's gen2 trainer does not read it", schema="gen2")
      for key in ("use_mixed_precision", "mixed_precision", "checkpoint_all_layers")),
    Rule("trainer.cpu_offload", _refuse_if(bool, "trainer.cpu_offload: true is not implemented"), schema="gen2"),
    Rule("loss.type", config_gen2_loss.loss),
    Rule("loss.args", note="read with loss.type"),
)
RULES = {(rule.schema, rule.key): rule for rule in TABLE}
SECTIONS = ("data", "trainer", "loss")  # read key by key; `model` has its own reader


@dataclass
class CreditMapping:
    """What a CREDIT config file became: report lines, refusals, and hydra overrides."""

    lines: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    read_otherwise: list[str] = field(default_factory=list)  # one warning each at a run's start


def _override(key: str, value: Any) -> str:
    from credit.models.credit.config import hydra_value  # the one writer of override values

    return f"{key}={hydra_value(value)}"


def rule_for(key: str, schema: str) -> Rule | None:
    """The row of `key` for a config of `schema` (gen1 or gen2): its own, else the shared one."""
    return RULES.get((schema, key)) or RULES.get(("", key))


def map_credit_file(conf: Mapping[str, Any]) -> CreditMapping:
    """Every key of `conf`'s data, trainer and loss sections and its top level (not `model`)."""
    out = CreditMapping()
    data = conf.get("data") or {}
    schema = "gen2" if cvg.is_gen2(conf) else "gen1"
    if data:  # a model-only file keeps this project's data settings
        out.overrides += [_override("data.layout", f"credit-{schema}"), _override("data.generate_if_missing", False)]
    present = [key for key in conf if key not in (*SECTIONS, "model")]
    for section in SECTIONS:
        values = conf.get(section) or {}
        present += [f"{section}.{key}" for key in values]
    if schema == "gen1" and isinstance(data, Mapping) and "levels" not in data and "variables" in data:
        present.append("data.levels")  # CREDIT's parser takes them from model.levels: read the files
    for key in present:
        section, _, name = key.rpartition(".")
        value = (conf.get(section) or {}).get(name) if section else conf.get(key)
        rule = rule_for(key, schema)
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
        for _, why in (pair for pair in result if pair[0] is None):
            part, reason = why.split(":", 1)
            out.ignored.append(part)
            out.lines.append(f"{part}: ignored ({reason.strip()})")
        for _, why in (pair for pair in result if pair[0] == READ_OTHERWISE):
            out.read_otherwise.append(why)
            out.lines.append(f"{why.split(':', 1)[0]}: read otherwise than CREDIT: {why.split(':', 1)[1].strip()}")
        result = [pair for pair in result if pair[0] not in (None, READ_OTHERWISE)]
        out.overrides += [_override(k, v) for k, v in result]
        targets = ", ".join(_override(k, v) for k, v in result) or "(nothing to set: this project's default)"
        out.lines.append(f"{key} -> {targets}")
    if schema == "gen1" and "root" not in " ".join(out.overrides):
        save_loc = data.get("save_loc") if isinstance(data, Mapping) else None
        if save_loc:
            out.overrides.append(_override("data.root", str(Path(cv.expand(save_loc)).parent)))
    # a trainer this project does not run is the refusal to name first: what else the file
    # holds (an ocean model's dates for years, say) follows from it
    out.refused.sort(key=lambda line: not line.startswith("trainer.type:"))
    return out
