"""`credit rollout`: forecasts from a checkpoint on the run's mesh, written and scored on rank 0.

Every rank checks the request the same way from the same files (checkpoint, model config,
init times, existing outputs) before any rank writes, so a refusal stops all ranks alike.
Every rank then runs every forward pass (tensor parallelism splits each one); rank 0
writes one netCDF file per init time, `skill.csv` and the plots.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch.distributed as dist
from omegaconf import DictConfig
from tqdm import tqdm

from credit.checkpoint.manager import checkpoint_keys
from credit.checkpoint.resume import find_checkpoint, load_forecast_weights
from credit.data import ensure_dataset
from credit.data.catalog import HOUR_NS
from credit.logs import configure_logging
from credit.parallel import Runtime, build_runtime, shutdown
from credit.rollout.checkpoint import check_model_config
from credit.rollout.climatology import training_climatology
from credit.rollout.errors import RolloutError
from credit.rollout.forecast import Forecaster, rollout_dataset
from credit.rollout.model import build_forecast_model, choose_weights
from credit.rollout.netcdf import forecast_dataset, input_attributes, write_forecast
from credit.rollout.plots import plot_map, plot_rmse_vs_lead, plot_spread_skill
from credit.rollout.skill import SkillAccumulator, write_skill_csv
from credit.rollout.times import check_coverage, data_times, fmt, forecast_filename, init_times, time_step

log = logging.getLogger(__name__)


@dataclass
class RolloutResult:
    checkpoint: Path
    weights: str  # "ema" or "model"
    output_dir: Path
    forecasts: list[Path] = field(default_factory=list)
    skill: list[dict[str, object]] = field(default_factory=list)  # skill.csv rows (rank 0)


@dataclass
class _Plan:
    checkpoint: Path
    weights: str
    inits: list[int]
    step: int  # the data's time step, ns
    outputs: list[Path]
    map_channel: str


def _channels(data: DictConfig) -> list[str]:
    """Target channel names in the dataset's order, without opening it."""
    v = data.variables
    return [f"{n}_{lv:g}" for n in v.upper_air for lv in data.levels] + [*v.surface, *v.diagnostic]


def _plan(cfg: DictConfig) -> _Plan:
    """Every check that can refuse the rollout, in the order a user fixes them."""
    ro = cfg.rollout
    checkpoint = find_checkpoint(ro.checkpoint, cfg.run_dir)
    check_model_config(cfg, checkpoint)
    weights = choose_weights(ro.weights, checkpoint_keys(checkpoint), checkpoint)
    inits = init_times(ro)
    times = data_times(cfg.data)
    step = time_step(times)
    check_coverage(inits, times, step, cfg.data.history_len, ro.lead_steps, cfg.data.root)
    channels = _channels(cfg.data)
    map_channel = ro.map_channel or channels[0]
    if map_channel not in channels:
        raise RolloutError(f"rollout.map_channel={map_channel!r} is not an output channel; "
                           f"allowed: {channels}")
    out = Path(ro.output_dir)
    outputs = [out / forecast_filename(t) for t in inits]
    if ro.skill:
        outputs.append(out / "skill.csv")
    existing = [p for p in outputs if p.exists()]
    if existing and not ro.overwrite:
        raise FileExistsError(
            f"{existing[0]} exists ({len(existing)} of the {len(outputs)} output files of this "
            f"rollout exist); pass rollout.overwrite=true to replace them or choose another "
            f"rollout.output_dir")
    return _Plan(checkpoint, weights, inits, step, outputs, map_channel)


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def run_rollout(cfg: DictConfig) -> RolloutResult:
    """Forecast `rollout.lead_steps` from every init time of `cfg.rollout` (validated config);
    rank 0 writes the files and returns the skill rows."""
    owns_group = not (dist.is_available() and dist.is_initialized())
    runtime = build_runtime(cfg)
    configure_logging(rank=runtime.rank)
    try:
        return _rollout(cfg, runtime)
    finally:
        if owns_group:
            shutdown()


def _skill_accumulator(cfg: DictConfig, dataset, attributes) -> SkillAccumulator:
    """Scores against the truth, persistence and the training climatology (rank 0)."""
    data, ro = cfg.data, cfg.rollout
    channels = dataset.target_channel_names
    flat = [*data.variables.surface, *data.variables.diagnostic]
    units = [str(attributes.variables.get(dataset.variable_of_channel[c], {}).get("units", ""))
             for c in channels]
    levels = [lv for _ in data.variables.upper_air for lv in dataset.levels] + [None] * len(flat)
    return SkillAccumulator(
        channels=channels, variables=[dataset.variable_of_channel[c] for c in channels],
        levels=levels, units=units, state_channels=len(dataset.state_channel_names),
        latitude=dataset.latitude, climatology=training_climatology(data, ro.climatology_samples),
        lead_steps=ro.lead_steps, step_hours=dataset.step_ns / HOUR_NS)


def _global_attributes(cfg: DictConfig, plan: _Plan) -> dict[str, str]:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "title": f"credit {cfg.model.name} forecast",
        "source": f"credit rollout of {cfg.model.name}, {plan.weights} weights of checkpoint "
                  f"{plan.checkpoint}; inputs from {cfg.data.root}",
        "history": f"{now} credit rollout rollout.lead_steps={cfg.rollout.lead_steps} "
                   f"rollout.checkpoint={plan.checkpoint}",
    }


def _write_skill(result: RolloutResult, skill: SkillAccumulator, plan: _Plan, dataset,
                 map_fields, lead_steps: int) -> None:
    out = result.output_dir
    result.skill = skill.rows()
    write_skill_csv(result.skill, out / "skill.csv")
    plot_rmse_vs_lead(result.skill, out / "rmse_vs_lead.png")
    if skill.members > 1:
        plot_spread_skill(result.skill, out / "spread_skill_vs_lead.png")
    stamp = forecast_filename(plan.inits[0])[len("forecast_"):-len(".nc")]
    hours = lead_steps * dataset.step_ns / HOUR_NS
    plot_map(*map_fields, dataset.latitude, dataset.longitude,
             f"{plan.map_channel}, init {fmt(plan.inits[0])}, lead {lead_steps} ({hours:g} h)",
             skill.units[dataset.target_channel_names.index(plan.map_channel)],
             out / f"map_{plan.map_channel}_{stamp}_lead{lead_steps}.png")
    log.info("skill (latitude-weighted RMSE, physical units):\n%s", skill_summary(result.skill))


def _rollout(cfg: DictConfig, runtime: Runtime) -> RolloutResult:
    ro, data = cfg.rollout, cfg.data
    ensure_dataset(data, runtime.is_main)
    plan = _plan(cfg)
    _barrier()  # no rank writes before every rank has accepted the request
    dataset = rollout_dataset(data, plan.inits, plan.step, ro.lead_steps)
    model = build_forecast_model(cfg, dataset, runtime)
    load_forecast_weights(model, plan.checkpoint, plan.weights)
    forecaster = Forecaster(model, dataset, runtime.device, seed=cfg.trainer.seed)
    if ro.members > 1 and not getattr(model, "injects_noise", False) and runtime.is_main:
        log.warning("rollout.members=%d with %s, which draws no noise at inference: every member is the same "
                    "forecast (model=crossformer-ensemble draws noise)", ro.members, cfg.model.name)
    result = RolloutResult(plan.checkpoint, plan.weights, Path(ro.output_dir))
    main = runtime.is_main
    attributes = input_attributes(data) if main else None
    skill = _skill_accumulator(cfg, dataset, attributes) if main and ro.skill else None
    global_attrs = _global_attributes(cfg, plan)
    upper, flat = list(data.variables.upper_air), [*data.variables.surface, *data.variables.diagnostic]
    map_index = dataset.target_channel_names.index(plan.map_channel)
    map_fields = None
    log.info("rollout: %d init time(s) x %d leads of %g h from %s (%s weights) into %s",
             len(plan.inits), ro.lead_steps, dataset.step_ns / HOUR_NS, plan.checkpoint,
             plan.weights, result.output_dir)
    for init in tqdm(plan.inits, desc="rollout", unit="init", disable=not (main and ro.progress_bar)):
        persistence = forecaster.persistence(init) if skill is not None else None
        predictions = []
        for k, (members, truth) in enumerate(forecaster.leads(init, ro.lead_steps, ro.members)):
            prediction = members.mean(axis=0) if ro.members > 1 else members[0]  # the ensemble mean
            predictions.append((members if ro.members > 1 else prediction).astype(np.float32))
            if skill is not None:
                skill.add(k, prediction, truth, persistence)
                if ro.members > 1:
                    skill.add_members(k, members, truth)
                if init == plan.inits[0] and k == ro.lead_steps - 1:
                    map_fields = (prediction[map_index], truth[map_index])
        if main:
            path = result.output_dir / forecast_filename(init)
            ds = forecast_dataset(
                np.stack(predictions), init=init, step=dataset.step_ns, upper_air=upper,
                levels=list(dataset.levels), flat=flat, latitude=dataset.latitude,
                longitude=dataset.longitude, attributes=attributes,
                global_attrs={**global_attrs, "init_time": fmt(init)})
            write_forecast(ds, path, complevel=ro.complevel, overwrite=ro.overwrite)
            result.forecasts.append(path)
    if skill is not None:
        _write_skill(result, skill, plan, dataset, map_fields, ro.lead_steps)
    _barrier()
    dataset.close()
    if main:
        figures = ", skill.csv, rmse_vs_lead.png" + (", spread_skill_vs_lead.png" if ro.members > 1 else "") + ", map"
        log.info("forecasts in %s (%d files%s)", result.output_dir, len(result.forecasts),
                 figures if skill is not None else "")
    return result


def skill_summary(rows: list[dict[str, object]]) -> str:
    """Model vs persistence RMSE per channel at the first and last lead."""
    leads = sorted({int(r["lead_step"]) for r in rows})
    picked = [lead for lead in dict.fromkeys((leads[0], leads[-1]))]
    lines = [f"{'channel':<10}{'lead h':>8}{'model':>13}{'persistence':>13}{'climatology':>13}"]
    for lead in picked:
        for r in (r for r in rows if int(r["lead_step"]) == lead):
            cells = [f"{float(r[k]):>13.5g}" if r[k] != "" else f"{'-':>13}"
                     for k in ("rmse_model", "rmse_persistence", "rmse_climatology")]
            lines.append(f"{r['channel']:<10}{float(r['lead_hours']):>8g}{''.join(cells)}")
    return "\n".join(lines)
