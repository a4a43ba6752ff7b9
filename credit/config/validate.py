"""Checks on a composed config that its types alone cannot express.

Runs before any data, model or process-group work. Each failure raises `ConfigError`
with one line naming the key, the value and what is allowed (`credit.config.checks`);
the `model.*` checks are `credit.config.validate_model`'s.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from credit.config.checks import ConfigError, check, check_each
from credit.config.validate_model import CREDIT_MODELS, validate_model

PARALLEL_DATA_MODES = ("fsdp2", "ddp", "none")
MIXED_PRECISION = ("none", "bf16")
SHARD_GRANULARITY = ("block", "grouped")
RESUME_MODES = ("auto", "never")
DEVICES = ("auto", "cpu", "cuda")
NONFINITE_MODES = ("error", "skip_sample")  # data.nonfinite
DATA_LAYOUTS = ("native", "credit-gen1", "credit-gen2")  # data.layout
SCHEDULES = ("warmup_cosine", "cosine_restarts", "epoch_cosine", "epoch_lambda")  # trainer.scheduler.type


def _parse_time(key: str, value: str) -> np.datetime64:
    try:
        return np.datetime64(value)
    except ValueError:
        raise ConfigError(f"{key}={value!r} is not an ISO date or time like 2000-01-31") from None


def validate_data(data: DictConfig) -> None:
    check(data.history_len >= 1, "data.history_len", data.history_len, "must be >= 1")
    check(data.nonfinite in NONFINITE_MODES, "data.nonfinite", data.nonfinite,
           f"allowed: {list(NONFINITE_MODES)}")
    check(data.forecast_len >= 1, "data.forecast_len", data.forecast_len, "must be >= 1")
    check(data.valid_forecast_len >= 1, "data.valid_forecast_len", data.valid_forecast_len,
          "must be >= 1 (validation's lead in steps)")
    check(data.num_workers >= 0, "data.num_workers", data.num_workers, "must be >= 0")
    check(data.valid_samples >= 1, "data.valid_samples", data.valid_samples, "must be >= 1")
    check(len(data.levels) >= 1 or not data.variables.upper_air, "data.levels", data.levels,
           "give at least one pressure level for the upper-air variables")
    check(len(data.variables.upper_air) + len(data.variables.surface) >= 1,
           "data.variables", "", "give at least one prognostic variable (upper_air or surface)")
    for key in ("train_period", "valid_period"):
        period = data[key]
        check(len(period) == 2, f"data.{key}", period, "give [start, end]")
        start, end = (_parse_time(f"data.{key}", v) for v in period)
        check(start <= end, f"data.{key}", period, "start must not be after end")
    check(data.layout in DATA_LAYOUTS, "data.layout", data.layout, f"one of {list(DATA_LAYOUTS)}")
    if data.layout == "credit-gen1":
        credit = data.credit
        check(credit.skip_periods >= 1, "data.credit.skip_periods", credit.skip_periods, "must be >= 1")
        check(credit.skip_periods == 1 or data.forecast_len == 1, "data.credit.skip_periods", credit.skip_periods,
               "1 when data.forecast_len > 1 (CREDIT calls skip_periods with multi-step training unstable)")
        check(credit.skip_periods == 1 or data.valid_forecast_len == 1, "data.credit.skip_periods",
              credit.skip_periods, "1 when data.valid_forecast_len > 1 (CREDIT's dataset refuses the pair)")
        check(credit.clamp is None or (len(credit.clamp) == 2 and credit.clamp[0] < credit.clamp[1]),
               "data.credit.clamp", credit.clamp, "null or [low, high] with low < high")
        for role in ("upper_air", "surface", "static", "diagnostic"):
            check(not data.variables[role] or bool(credit.files[role]), f"data.credit.files.{role}",
                   credit.files[role], f"a glob for data.variables.{role}={list(data.variables[role])}")
        check(not data.variables.forcing or bool(credit.files.dynamic_forcing), "data.credit.files.dynamic_forcing",
               credit.files.dynamic_forcing, "a glob for data.variables.forcing (CREDIT's dynamic forcing)")
        check(not credit.forcing_file_variables or bool(credit.files.forcing), "data.credit.files.forcing",
               credit.files.forcing, "the forcing file of data.credit.forcing_file_variables")
        for role in ("mean", "std"):
            check(bool(credit.files[role]), f"data.credit.files.{role}", credit.files[role], "the statistics file")
        check(not data.generate_if_missing, "data.generate_if_missing", data.generate_if_missing,
               "false with data.layout=credit-gen1 (`credit data generate --layout credit-gen1` writes such data)")
    if data.layout == "credit-gen2":
        _validate_credit_gen2(data)
    else:
        check(data.credit.tisr.source is None, "data.credit.tisr.source", data.credit.tisr.source,
              "null unless data.layout=credit-gen2 (CREDIT's gen2 tisr source)")
        check(data.credit.geopotential.output is None, "data.credit.geopotential.output",
              data.credit.geopotential.output, "null unless data.layout=credit-gen2 (CREDIT's gen2 postblock)")
    gen = data.generate
    check(len(gen.grid) == 2 and min(gen.grid) >= 4, "data.generate.grid", gen.grid,
           "give [n_latitudes, n_longitudes], each >= 4")
    check(set(gen.train_years) <= set(gen.years), "data.generate.train_years", gen.train_years,
           f"must be among data.generate.years={list(gen.years)}")


def _validate_credit_gen2(data: DictConfig) -> None:
    credit, files = data.credit, data.credit.files
    check(bool(credit.timestep), "data.credit.timestep", credit.timestep, "the master clock's step, e.g. '6h' "
           "(CREDIT's data.timestep)")
    try:
        step = pd.Timedelta(credit.timestep)
    except ValueError:
        step = pd.Timedelta(0)
    check(step > pd.Timedelta(0), "data.credit.timestep", credit.timestep, "a positive time span, e.g. '6h'")
    check(credit.clamp is None or (len(credit.clamp) == 2 and credit.clamp[0] < credit.clamp[1]),
           "data.credit.clamp", credit.clamp, "null or [low, high] with low < high")
    check(not credit.forcing_file_variables, "data.credit.forcing_file_variables", list(credit.forcing_file_variables),
           "empty with data.layout=credit-gen2 (gen2 forcing is data.variables.forcing, CREDIT's dynamic_forcing)")
    check(credit.skip_periods == 1, "data.credit.skip_periods", credit.skip_periods, "1 with data.layout=credit-gen2")
    check(credit.stats_levels is None or all(int(p) >= 1 for p in credit.stats_levels), "data.credit.stats_levels",
           credit.stats_levels, "null or 1-indexed positions on the statistics' level axis")
    v = data.variables
    solar = credit.tisr
    computed = solar.variable if solar.source is not None else None  # a tisr source computes it: no file
    if computed is not None:
        check(list(v.forcing)[-1:] == [computed], "data.variables.forcing", list(v.forcing),
              f"ending with {computed!r}, the variable of data.credit.tisr (its channel comes last, as CREDIT's "
              "concat places a second source's)")
        check(solar.integration_steps >= 1, "data.credit.tisr.integration_steps", solar.integration_steps, "an int >= 1")
    for role, names in (("prognostic", [*v.upper_air, *v.surface]),
                        ("dynamic_forcing", [n for n in v.forcing if n != computed]),
                        ("static", list(v.static)), ("diagnostic", list(v.diagnostic))):
        check(not names or bool(files[role]), f"data.credit.files.{role}", files[role],
               f"a path template for {names}")
    if files.bridgescaler:
        for role in ("mean", "std"):
            check(not files[role], f"data.credit.files.{role}", files[role],
                   "null with data.credit.files.bridgescaler (one normaliser: the bridgescaler file or mean/std)")
    else:
        for role in ("mean", "std"):
            check(bool(files[role]), f"data.credit.files.{role}", files[role],
                   "the era5_normalizer's statistics file (or data.credit.files.bridgescaler)")
        check(not files.bridgescaler_inverse, "data.credit.files.bridgescaler_inverse", files.bridgescaler_inverse,
               "null without data.credit.files.bridgescaler")
        check(credit.scaled_variables is None, "data.credit.scaled_variables", credit.scaled_variables,
               "null without data.credit.files.bridgescaler (the era5_normalizer scales what its files hold)")
        check(not credit.spatial_variables, "data.credit.spatial_variables", list(credit.spatial_variables),
               "empty without data.credit.files.bridgescaler (per-grid-point scalers are a bridgescaler file's)")
    every = [*v.upper_air, *v.surface, *v.forcing, *v.static, *v.diagnostic]
    for key, kinds, names in (("transforms", ("log", "sqrt", "fill"), every),
                              ("output_inverse", ("exp", "square"), [*v.upper_air, *v.surface, *v.diagnostic])):
        for i, block in enumerate(credit[key]):
            where = f"data.credit.{key}[{i}]"
            check(block.kind in kinds, f"{where}.kind", block.kind, f"one of {list(kinds)}")
            check(block.base in ("e", "2", "10"), f"{where}.base", block.base, "e, 2 or 10")
            check(block.eps > 0 and math.isfinite(block.eps), f"{where}.eps", block.eps, "a number > 0")
            check(bool(block.rules) == (block.kind == "fill"), f"{where}.rules", list(block.rules),
                  "rules for kind fill (and only for it)")
            for j, rule in enumerate(block.rules):
                check(rule.op in ("==", "!=", "<", "<=", ">", ">="), f"{where}.rules[{j}].op", rule.op,
                      "==, !=, <, <=, > or >=")
            for name in block.variables:
                check(name in names, f"{where}.variables", list(block.variables),
                      f"variables of the data ({names}); {name!r} is not one")
    flat = [*v.surface, *v.forcing, *v.static, *v.diagnostic]
    scaled = flat if credit.scaled_variables is None else [n for n in flat if n in credit.scaled_variables]
    for name in credit.spatial_variables:
        check(name in scaled, "data.credit.spatial_variables", list(credit.spatial_variables),
              f"2-D variables the bridgescaler scales ({scaled}); {name!r} is not one")
    check(not data.generate_if_missing, "data.generate_if_missing", data.generate_if_missing,
           "false with data.layout=credit-gen2 (`credit data generate --layout credit-gen2` writes such data)")
    _validate_geopotential(data)


def _validate_geopotential(data: DictConfig) -> None:
    """data.credit.geopotential: its inputs are the data's variables, its output a new name."""
    geo, v = data.credit.geopotential, data.variables
    if geo.output is None:
        return
    for key, names, what in (("temperature", v.upper_air, "an upper-air variable"),
                             ("specific_humidity", v.upper_air, "an upper-air variable"),
                             ("surface_pressure", v.surface, "a surface variable"),
                             ("surface_geopotential", v.static, "a static variable")):
        check(geo[key] in names, f"data.credit.geopotential.{key}", geo[key], f"{what} of the data ({list(names)})")
    every = [*v.upper_air, *v.surface, *v.forcing, *v.static, *v.diagnostic]
    check(geo.output not in every, "data.credit.geopotential.output", geo.output,
          "a name no variable of the data has (the computed geopotential is scored beside them)")
    check(bool(geo.level_info_file), "data.credit.geopotential.level_info_file", geo.level_info_file,
          "the level coefficient file (CREDIT's credit/metadata/ERA5_Lev_Info.nc)")


def validate_trainer(trainer: DictConfig) -> None:
    check(trainer.max_steps >= 1, "trainer.max_steps", trainer.max_steps, "must be >= 1")
    check(trainer.steps_per_job >= 0, "trainer.steps_per_job", trainer.steps_per_job,
           "must be >= 0 (0: run to trainer.max_steps)")
    check(trainer.batch_size >= 1, "trainer.batch_size", trainer.batch_size, "must be >= 1")
    check(trainer.grad_accum_steps >= 1, "trainer.grad_accum_steps", trainer.grad_accum_steps,
           "must be >= 1")
    check(trainer.grad_clip >= 0 and math.isfinite(trainer.grad_clip), "trainer.grad_clip",
           trainer.grad_clip, "must be >= 0 (0 disables clipping)")
    check(trainer.epochs >= 0, "trainer.epochs", trainer.epochs, "must be >= 0 (0: trainer.max_steps)")
    check(trainer.epochs_per_job >= 0, "trainer.epochs_per_job", trainer.epochs_per_job,
           "must be >= 0 (0: trainer.steps_per_job)")
    check(trainer.valid_every_n_steps >= 0, "trainer.valid_every_n_steps",
           trainer.valid_every_n_steps, "must be >= 0 (0: only at the end)")
    check(trainer.device in DEVICES, "trainer.device", trainer.device, f"allowed: {list(DEVICES)}")
    resume = trainer.resume
    check(resume in RESUME_MODES or os.path.exists(resume), "trainer.resume", resume,
           "use 'auto', 'never' or the path of an existing checkpoint")
    start = trainer.credit_start
    if start.checkpoint:
        check(os.path.isfile(start.checkpoint), "trainer.credit_start.checkpoint", start.checkpoint,
               "no such file (CREDIT's trainer writes save_loc/checkpoint.pt)")
        check(resume in RESUME_MODES, "trainer.credit_start.checkpoint", start.checkpoint,
               f"applies when run_dir holds no checkpoint of this project; trainer.resume={resume} names one: "
               "give one of the two")
    for flag in ("optimizer", "reload_epoch", "fsdp"):
        check(start.checkpoint or not start[flag], f"trainer.credit_start.{flag}", start[flag],
               "needs trainer.credit_start.checkpoint (CREDIT's checkpoint.pt)")
    if start.checkpoint and start.fsdp:
        folder = os.path.dirname(start.checkpoint)
        needed = ["model_checkpoint.pt"] + (["optimizer_checkpoint.pt"] if start.optimizer or start.reload_epoch else [])
        for name in needed:
            check(os.path.isfile(os.path.join(folder, name)), "trainer.credit_start.fsdp", start.fsdp,
                  f"CREDIT's fsdp mode writes {name} beside checkpoint.pt; {os.path.join(folder, name)} is missing")
    opt = trainer.optimizer
    check(opt.lr > 0, "trainer.optimizer.lr", opt.lr, "must be > 0")
    check(len(opt.betas) == 2 and all(0 <= b < 1 for b in opt.betas), "trainer.optimizer.betas",
           opt.betas, "give two values in [0, 1)")
    check(opt.weight_decay >= 0, "trainer.optimizer.weight_decay", opt.weight_decay, "must be >= 0")
    check(opt.eps > 0, "trainer.optimizer.eps", opt.eps, "must be > 0")
    sched = trainer.scheduler
    check(sched.warmup_steps >= 0, "trainer.scheduler.warmup_steps", sched.warmup_steps,
           "must be >= 0")
    check(sched.total_steps >= 0, "trainer.scheduler.total_steps", sched.total_steps,
           "must be >= 0 (0: trainer.max_steps)")
    check(sched.type in SCHEDULES, "trainer.scheduler.type", sched.type, f"one of {list(SCHEDULES)}")
    if sched.type == "cosine_restarts":
        check(sched.first_cycle_steps > sched.warmup_steps, "trainer.scheduler.first_cycle_steps",
               sched.first_cycle_steps, f"must exceed trainer.scheduler.warmup_steps={sched.warmup_steps}")
        check(sched.cycle_mult > 0 and sched.gamma > 0, "trainer.scheduler.cycle_mult/gamma",
               [sched.cycle_mult, sched.gamma], "must be > 0")
    if sched.type == "epoch_cosine":
        check(sched.t_max_epochs >= 1, "trainer.scheduler.t_max_epochs", sched.t_max_epochs, "must be >= 1")
    check(0 <= sched.min_lr_ratio <= 1, "trainer.scheduler.min_lr_ratio", sched.min_lr_ratio,
           "must be in [0, 1]")
    ckpt = trainer.checkpoint
    check(ckpt.every_n_steps >= 0, "trainer.checkpoint.every_n_steps", ckpt.every_n_steps,
           "must be >= 0 (0: only at the end)")
    check(ckpt.keep_latest_k >= 1, "trainer.checkpoint.keep_latest_k", ckpt.keep_latest_k,
           "must be >= 1")
    par = trainer.parallelism
    check(par.data in PARALLEL_DATA_MODES, "trainer.parallelism.data", par.data,
           f"allowed: {list(PARALLEL_DATA_MODES)}")
    check(par.tensor >= 1, "trainer.parallelism.tensor", par.tensor, "must be >= 1")
    check(par.ensemble >= 1, "trainer.parallelism.ensemble", par.ensemble, "must be >= 1")
    check(par.ensemble == 1 or trainer.ensemble_size > 1, "trainer.parallelism.ensemble", par.ensemble,
          "> 1 spreads an ensemble's members over ranks: it needs trainer.ensemble_size > 1 (and a CRPS loss)")
    check(par.ensemble == 1 or trainer.ensemble_size % par.ensemble == 0, "trainer.parallelism.ensemble",
          par.ensemble, f"must divide trainer.ensemble_size={trainer.ensemble_size} (each rank of the ensemble "
          f"axis holds an equal share of a sample's members)")
    check(par.ensemble == 1 or par.data != "none", "trainer.parallelism.ensemble", par.ensemble,
          "> 1 needs trainer.parallelism.data=fsdp2 or ddp (the ranks' member gradients are added over it)")
    check(par.mixed_precision in MIXED_PRECISION, "trainer.parallelism.mixed_precision",
           par.mixed_precision, f"allowed: {list(MIXED_PRECISION)}")
    check(par.mixed_precision == "none" or par.data != "none",
           "trainer.parallelism.mixed_precision", par.mixed_precision,
           "bf16 needs trainer.parallelism.data=fsdp2 or ddp")
    check(par.shard_granularity in SHARD_GRANULARITY, "trainer.parallelism.shard_granularity",
           par.shard_granularity, f"allowed: {list(SHARD_GRANULARITY)}")
    check(par.shard_granularity == "block" or par.data == "fsdp2",
           "trainer.parallelism.shard_granularity", par.shard_granularity,
           "grouped needs trainer.parallelism.data=fsdp2")
    check(par.reshard_after_forward or par.data == "fsdp2",
           "trainer.parallelism.reshard_after_forward", par.reshard_after_forward,
           "false needs trainer.parallelism.data=fsdp2 (only FSDP2 gathers weights)")
    check(trainer.log_every_n_steps >= 1, "trainer.log_every_n_steps", trainer.log_every_n_steps,
           "must be >= 1")
    check(0.0 < trainer.ema.decay < 1.0, "trainer.ema.decay", trainer.ema.decay,
           "must be in (0, 1)")
    check(trainer.loss.function in LOSS_FUNCTIONS + ENSEMBLE_LOSS_FUNCTIONS, "trainer.loss.function",
           trainer.loss.function, f"one of {', '.join(LOSS_FUNCTIONS)}, or with trainer.ensemble_size > 1 "
           f"{' or '.join(ENSEMBLE_LOSS_FUNCTIONS)}")
    check(trainer.ensemble_size >= 1, "trainer.ensemble_size", trainer.ensemble_size, "must be >= 1")
    ensemble_loss = trainer.loss.function in ENSEMBLE_LOSS_FUNCTIONS
    check(ensemble_loss or trainer.ensemble_size == 1, "trainer.ensemble_size", trainer.ensemble_size,
           f"1 with trainer.loss.function={trainer.loss.function} (an ensemble is scored by "
           f"{' or '.join(ENSEMBLE_LOSS_FUNCTIONS)})")
    check(not ensemble_loss or trainer.ensemble_size > 1, "trainer.loss.function", trainer.loss.function,
           "needs trainer.ensemble_size > 1 (a CRPS over one member divides by m (m - 1) = 0)")
    check(0.0 < trainer.loss.crps_alpha <= 1.0, "trainer.loss.crps_alpha", trainer.loss.crps_alpha,
           "must be in (0, 1]")
    check(trainer.loss.crps_alpha == 1.0 or trainer.loss.function == "almost_fair_crps", "trainer.loss.crps_alpha",
           trainer.loss.crps_alpha, "1 unless trainer.loss.function=almost_fair_crps")
    check(trainer.loss.forecast_steps in ("mean", "sum"), "trainer.loss.forecast_steps",
           trainer.loss.forecast_steps, "mean or sum")
    check(trainer.loss.huber_delta > 0, "trainer.loss.huber_delta", trainer.loss.huber_delta, "must be > 0")
    check(not trainer.loss.overrides or trainer.loss.function in LOSS_FUNCTIONS, "trainer.loss.overrides",
          dict(trainer.loss.overrides), f"empty with trainer.loss.function={trainer.loss.function} (a CRPS scores "
          "the members of every variable together)")
    for name, override in trainer.loss.overrides.items():
        where = f"trainer.loss.overrides.{name}"
        keys = sorted(override) if isinstance(override, Mapping) else None
        check(keys is not None and "function" in keys and set(keys) <= {"function", "huber_delta"}, where, override,
              "{function: NAME} or {function: huber, huber_delta: D}")
        check(override.function in LOSS_FUNCTIONS, f"{where}.function", override.function,
              f"one of {', '.join(LOSS_FUNCTIONS)} (a CRPS is trainer.loss.function itself)")
        delta = override.get("huber_delta", 1.0)
        check(isinstance(delta, (int, float)) and delta > 0, f"{where}.huber_delta", delta, "a number > 0")
    check(trainer.loss.space in ("normalized", "physical"), "trainer.loss.space", trainer.loss.space,
           "normalized or physical")
    check(trainer.loss.combine in ("channels", "variables"), "trainer.loss.combine", trainer.loss.combine,
           "channels or variables")
    check(not trainer.loss.inverse_variance or trainer.loss.combine == "variables", "trainer.loss.inverse_variance",
           trainer.loss.inverse_variance, "false unless trainer.loss.combine=variables (each variable's weight is "
           "divided by its variance)")
    if trainer.loss.learnable_variance:
        check(trainer.loss.combine == "variables", "trainer.loss.learnable_variance", True,
              "needs trainer.loss.combine=variables (one learned weight per variable)")
        check(not trainer.loss.inverse_variance, "trainer.loss.learnable_variance", True,
              "or trainer.loss.inverse_variance, not both (the learned weights start at the inverse variances)")
        check(trainer.loss.function in LOSS_FUNCTIONS, "trainer.loss.learnable_variance", True,
              f"needs an elementwise trainer.loss.function ({', '.join(LOSS_FUNCTIONS)}), not a CRPS")
    for weight_name, weight in trainer.loss.variable_weights.items():
        values = list(weight) if OmegaConf.is_list(weight) or isinstance(weight, (list, tuple)) else [weight]
        check(all(isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0 for w in values),
               f"trainer.loss.variable_weights.{weight_name}", weight,
               "a number >= 0, or a list of them (one per level of an upper-air variable)")


ROLLOUT_WEIGHTS = ("auto", "ema", "model")
# the keys of credit.train.losses.ERRORS (config sits below train: the names are repeated,
# and tests/train/test_losses.py checks the two agree)
LOSS_FUNCTIONS = ("mse", "mae", "huber", "logcosh", "xtanh", "xsigmoid", "msle")
ENSEMBLE_LOSS_FUNCTIONS = ("kcrps", "almost_fair_crps")  # credit.train.ensemble.ENSEMBLE_FUNCTIONS
SEQUENCE_PARALLEL_MODELS = CREDIT_MODELS  # the models whose stages declare their grids


def validate_rollout(rollout: DictConfig) -> None:
    """Shape of the rollout keys; checkpoint existence and data coverage are checked when
    a rollout starts, so a training run never depends on them."""
    check(bool(rollout.checkpoint), "rollout.checkpoint", rollout.checkpoint,
           "use 'auto' or the path of a checkpoint directory")
    check(rollout.weights in ROLLOUT_WEIGHTS, "rollout.weights", rollout.weights,
           f"allowed: {list(ROLLOUT_WEIGHTS)}")
    check(rollout.lead_steps >= 1, "rollout.lead_steps", rollout.lead_steps, "must be >= 1")
    check(rollout.members >= 1, "rollout.members", rollout.members, "must be >= 1")
    check(bool(rollout.output_dir), "rollout.output_dir", rollout.output_dir,
           "must be a directory path")
    check(0 <= rollout.complevel <= 9, "rollout.complevel", rollout.complevel,
           "must be in 0..9 (0: uncompressed)")
    check(rollout.climatology_samples >= 1, "rollout.climatology_samples",
           rollout.climatology_samples, "must be >= 1")
    for value in rollout.init_times:
        _parse_time("rollout.init_times", value)
    if not rollout.init_times:
        span = rollout.init_range
        start = _parse_time("rollout.init_range.start", span.start)
        end = _parse_time("rollout.init_range.end", span.end)
        check(start <= end, "rollout.init_range.end", span.end,
               f"must not be before rollout.init_range.start={span.start}")
        check(span.every_hours >= 1, "rollout.init_range.every_hours", span.every_hours,
               "must be >= 1")


SDC_CHECKS = ("comm", "replica", "compute")
SDC_ACTIONS = ("warn", "stop", "rollback")
SDC_INJECT_KINDS = ("none", "gemm_output", "all_gather", "grad_shard")


def validate_sdc(sdc: DictConfig, checkpoint_every: int) -> None:
    """`diagnostics.sdc`: a typo must never run a weaker check and report green. Whether a
    check has anything to compare in the run's layout is decided at setup
    (`credit.diagnostics`), where the layout is known."""
    check(sdc.every_n_steps >= 1, "diagnostics.sdc.every_n_steps", sdc.every_n_steps,
           "must be >= 1")
    check(sdc.action in SDC_ACTIONS, "diagnostics.sdc.action", sdc.action,
           f"allowed: {list(SDC_ACTIONS)}")
    check_each("diagnostics.sdc.checks", sdc.checks, lambda c: c in SDC_CHECKS,
          f"each check must be one of {list(SDC_CHECKS)}")
    check(len(set(sdc.checks)) == len(sdc.checks), "diagnostics.sdc.checks", sdc.checks,
           "names a check twice")
    check(len(sdc.checks) >= 1 or not sdc.enabled, "diagnostics.sdc.checks", sdc.checks,
           f"give at least one of {list(SDC_CHECKS)} (or diagnostics.sdc.enabled=false)")
    check(sdc.action != "rollback" or checkpoint_every >= 1 or not sdc.enabled,
           "diagnostics.sdc.action", sdc.action,
           "rollback needs trainer.checkpoint.every_n_steps >= 1 (a verified checkpoint to return to)")
    inject = sdc.inject
    check(inject.kind in SDC_INJECT_KINDS, "diagnostics.sdc.inject.kind", inject.kind,
           f"allowed: {list(SDC_INJECT_KINDS)}")
    if inject.kind == "none":
        return
    check(sdc.enabled, "diagnostics.sdc.inject.kind", inject.kind,
           "injecting a fault needs diagnostics.sdc.enabled=true (the checks that must catch it)")
    check(bool(inject.layer), "diagnostics.sdc.inject.layer", inject.layer,
           "name the nn.Linear module to corrupt, e.g. stages.0.layers.0.0.to_q")
    check(inject.step >= 1 and inject.step % sdc.every_n_steps == 0, "diagnostics.sdc.inject.step",
           inject.step, f"must be a checked step: a multiple of diagnostics.sdc.every_n_steps="
           f"{sdc.every_n_steps}")
    check(inject.rank >= 0, "diagnostics.sdc.inject.rank", inject.rank, "must be >= 0")
    check(inject.index >= 0, "diagnostics.sdc.inject.index", inject.index, "must be >= 0")
    check(0 <= inject.bit <= 31, "diagnostics.sdc.inject.bit", inject.bit,
           "must be in 0..31 (0..15 for bf16 tensors)")


def validate_config(cfg: DictConfig) -> None:
    """Raise ConfigError naming the first key whose value cannot be used."""
    check(bool(cfg.run_dir), "run_dir", cfg.run_dir, "must be a directory path")
    validate_trainer(cfg.trainer)
    validate_model(cfg.model, tensor=cfg.trainer.parallelism.tensor)
    if cfg.trainer.parallelism.sequence_parallel:
        check(cfg.trainer.parallelism.tensor > 1, "trainer.parallelism.sequence_parallel", True,
               "needs trainer.parallelism.tensor > 1 (it splits rows over the tensor-parallel ranks)")
        check(cfg.model.name in SEQUENCE_PARALLEL_MODELS, "trainer.parallelism.sequence_parallel", True,
               f"is built for model.name in {list(SEQUENCE_PARALLEL_MODELS)}, got {cfg.model.name!r}")
    if cfg.model.gemm == "deterministic":
        par = cfg.trainer.parallelism
        check(par.mixed_precision == "none", "trainer.parallelism.mixed_precision", par.mixed_precision,
               "model.gemm=deterministic computes in fp32; use 'none'")
        check(par.ensemble & (par.ensemble - 1) == 0, "trainer.parallelism.ensemble", par.ensemble,
              "a power of two with model.gemm=deterministic (each rank's members are then a subtree of "
              "the one-process gradient tree)")
        check(par.ensemble == 1 or cfg.trainer.batch_size == 1, "trainer.batch_size", cfg.trainer.batch_size,
              f"1 with trainer.parallelism.ensemble={par.ensemble} and model.gemm=deterministic: a rank holding "
              f"part of the members of several samples cannot add its gradients in the one-process order "
              f"(samples, then members); raise the samples with more data-parallel ranks or grad_accum_steps")
    validate_data(cfg.data)
    if cfg.model.name == "crossformer-ensemble":
        check(cfg.data.history_len == 1, "data.history_len", cfg.data.history_len,
              "1 with model=crossformer-ensemble (CREDIT's class averages input frames in pairs where its encoder "
              "takes them stacked: it runs with frames 1 only)")
    validate_rollout(cfg.rollout)
    validate_sdc(cfg.diagnostics.sdc, cfg.trainer.checkpoint.every_n_steps)
    variables = cfg.data.variables
    output_vars = [*variables.upper_air, *variables.surface, *variables.diagnostic]
    for name in cfg.trainer.loss.variable_weights:
        check(name in output_vars, "trainer.loss.variable_weights", name,
               f"is not an output variable; allowed: {output_vars}")
    for name in cfg.trainer.loss.overrides:
        check(name in output_vars, "trainer.loss.overrides", name, f"is not an output variable; allowed: {output_vars}")
    if cfg.data.credit.geopotential.output is not None:
        loss = cfg.trainer.loss
        check(loss.space == "physical" and loss.combine == "variables", "data.credit.geopotential.output",
              cfg.data.credit.geopotential.output, "null unless trainer.loss.space=physical and "
              "trainer.loss.combine=variables (CREDIT's BaseLoss scores the computed geopotential in physical units)")
        check(not loss.learnable_variance and cfg.trainer.ensemble_size == 1, "data.credit.geopotential.output",
              cfg.data.credit.geopotential.output, "null with trainer.loss.learnable_variance or an ensemble "
              "(CREDIT's BaseLoss refuses computed diagnostics with learned weights)")
