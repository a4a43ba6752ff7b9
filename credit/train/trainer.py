"""The training loop: step -> validate -> checkpoint -> log.

The sampler shards by data-parallel rank only, only rank 0 writes files, every checkpoint
is a sharded DCP directory, and each step's randomness is reseeded from (seed, dp rank,
step), so neither restarts nor validation shift it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from credit.checkpoint.config_check import check_resume_config
from credit.checkpoint.manager import CheckpointManager
from credit.checkpoint.resume import ResumedRun, resume_source, resume_training, start_from_credit
from credit.checkpoint.training_state import Progress, training_state
from credit.diagnostics import SDC_COLUMNS, SDCDetector, StepReport
from credit.data import (
    DPShardedBatchSampler,
    build_dataset,
    ensure_dataset,
    latitude_weights,
    model_layout,
    recycled,
)
from credit.models import EMA, advance_spectral_norm, attach_post_blocks, build_model
from credit.models.dropout import MemberBlock, dropout_step
from credit.parallel import Runtime, seed_for_init, seed_for_step
from credit.train.loaders import build_loaders
from credit.train.ensemble import MembersGathered, with_members
from credit.train.losses import training_loss
from credit.train.metrics import MetricsLog, plot_loss
from credit.train.setup import build_optimizer, choose_foreach, parallelize_for_training
from credit.train.memory import PeakMemory, mib
from credit.train.progress import TrainingProgress
from credit.train.resume_config import apply_config_hyperparameters
from credit.train.schedule import lambda_schedule, schedule_function
from credit.train.sdc_response import SDCResponse
from credit.train.step import backward_micro_batch, dynamic_clip_scale, step_loss, update_parameters
from credit.train.validation import evaluate, output_channel_variables

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    loss: float  # mean over micro-batches and dp replicas
    grad_norm: float  # global, before clipping
    lr: float  # the learning rate this step used
    seconds: float
    sdc: StepReport  # empty unless the step was checked


class Trainer:
    def __init__(self, cfg: DictConfig, runtime: Runtime) -> None:
        self.cfg = cfg
        self.runtime = runtime
        self.run_dir = Path(cfg.run_dir)
        self.deterministic = cfg.model.gemm == "deterministic"
        self.checkpoints = CheckpointManager(
            self.run_dir / "checkpoints", cfg.trainer.checkpoint.keep_latest_k
        )
        self.skipped_samples = 0  # data.nonfinite=skip_sample, in this process's batches
        self._step_batches: list[dict[str, torch.Tensor]] = []
        self._dynamic_clip_scale = (dynamic_clip_scale(runtime.dp_size, self.deterministic)
                                    if cfg.trainer.grad_clip_dynamic else None)
        if self._dynamic_clip_scale is not None and self.deterministic and runtime.dp_size > 1:
            log.warning("trainer.grad_clip_dynamic (CREDIT's grad_max_norm: dynamic): deterministic mode clips "
                        "to sqrt(the norm) at every layout, CREDIT's one-process limit, not sqrt(%d ranks x the "
                        "norm), so this run's bits are one process's", runtime.dp_size)

    # ----------------------------------------------------------------- setup
    def setup(self) -> None:
        self._build_data()
        self._build_model()
        self._build_optimization()
        source = resume_source(
            self.cfg.trainer.resume, self.run_dir, self.checkpoints, self.runtime.is_main
        )
        if source is not None:
            self.load(source)
        elif self.cfg.trainer.credit_start.checkpoint:
            self._start_from_credit()
        elif getattr(self.cfg.model, "freeze", False) and self.runtime.is_main:
            log.warning("model.freeze=true (CREDIT's default: fine-tuning) with no checkpoint to start from: only "
                        "the noise layers train and the CrossFormer keeps its random weights; start from a "
                        "deterministic CrossFormer (trainer.resume=PATH, a CREDIT file's load_weights) or set "
                        "model.freeze=false")
        self._build_loaders()

    def _build_data(self) -> None:
        data = self.cfg.data
        ensure_dataset(data, self.runtime.is_main)
        self.train_set = build_dataset(data, "train_period")
        self.valid_set = build_dataset(data, "valid_period")
        variables = data.variables
        self.channel_variables = output_channel_variables(
            variables.upper_air, data.levels, variables.surface, variables.diagnostic
        )
        self.state_channels = len(self.train_set.state_channel_names)

    def _build_model(self) -> None:
        cfg, rt = self.cfg, self.runtime
        # fully_shard does not broadcast weights: every rank builds identical full weights.
        seed_for_init(cfg.trainer.seed)
        layout = model_layout(cfg.data, self.train_set)
        self.model = build_model(cfg.model, **layout)
        self.model = attach_post_blocks(self.model, cfg.model, cfg.data, self.train_set).to(rt.device)
        self.sdc = None
        if cfg.diagnostics.sdc.enabled:
            self.sdc = SDCDetector(cfg.diagnostics.sdc, deterministic=self.deterministic,
                                   run_dir=self.run_dir, rank=rt.rank, device=rt.device,
                                   world_size=rt.layout.world_size if rt.layout else 1)
            self.sdc.attach_compute(self.model)  # before TP: it taps each Linear's own output
        if rt.mesh is not None:
            parallelize_for_training(self.model, rt.mesh, cfg)
        elif cfg.trainer.parallelism.mixed_precision != "none":
            log.warning("trainer.parallelism.mixed_precision=%s applies through FSDP2/DDP's mesh, which one "
                        "process does not build: this run computes in fp32 (launch 2 or more ranks for it)",
                        cfg.trainer.parallelism.mixed_precision)
        if self.sdc is not None:
            self.sdc.attach(self.model)
            log.info("%s", self.sdc.describe())
        ema = cfg.trainer.ema
        self.ema = EMA(self.model, ema.decay) if ema.enabled else None

    def _build_optimization(self) -> None:
        trainer, rt = self.cfg.trainer, self.runtime
        self.sampler = DPShardedBatchSampler(
            len(self.train_set),
            trainer.batch_size,
            dp_rank=rt.dp_rank,
            dp_size=rt.dp_size,
            seed=trainer.seed,
        )
        if self.deterministic and rt.is_main:  # per-rank batches (CREDIT's train_batch_size) make the step
            log.info("deterministic mode: a step takes a global batch of dp %d x trainer.batch_size %d = %d samples; "
                     "another layout gives these bits at the same global batch", rt.dp_size, trainer.batch_size,
                     self.sampler.global_batch_size)
        self._resolve_epochs()
        self.optimizer = build_optimizer(self.model, trainer.optimizer, self.deterministic)
        sched = trainer.scheduler
        self.scheduler = lambda_schedule(
            self.optimizer, schedule_function(sched, trainer.max_steps, self.sampler.batches_per_epoch))
        lat_w = latitude_weights(self.train_set.latitude)
        if not trainer.loss.latitude_weighting:
            lat_w = torch.ones_like(lat_w)
        self.lat_weights = lat_w
        self.loss_fn = training_loss(trainer.loss, self.channel_variables, lat_w, self.train_set.target_std,
                                     self.train_set.target_mean, self.train_set.output_inverse,
                                     self.train_set.computed_output).to(rt.device)
        self.learned = self.loss_fn.learned  # trainer.loss.learnable_variance: s_v, stepped beside the model
        if self.learned is not None:
            opt = trainer.optimizer
            self.learned.attach_optimizer(opt.lr, opt.betas, opt.eps, opt.weight_decay)
        self.valid_loss_fn = self.loss_fn.for_validation()  # learned weights: those of the first step
        # members spread over the ens axis: training gathers them before the CRPS
        self.train_loss = (MembersGathered(self.loss_fn, rt.mesh["ens"].get_group()) if rt.ens_size > 1
                           else self.loss_fn)
        self.progress = Progress(global_batch_size=self.sampler.global_batch_size)

    def _resolve_epochs(self) -> None:
        """`trainer.epochs` / `epochs_per_job` (CREDIT's full passes) as `max_steps` /
        `steps_per_job`, from the batches of one pass at this run's global batch."""
        trainer = self.cfg.trainer
        per_epoch = self.sampler.batches_per_epoch
        if trainer.epochs:
            trainer.max_steps = trainer.epochs * per_epoch
        if trainer.epochs_per_job:
            trainer.steps_per_job = trainer.epochs_per_job * per_epoch
        if (trainer.epochs or trainer.epochs_per_job) and self.runtime.is_main:
            log.info("trainer.epochs=%d, epochs_per_job=%d at %d batches per epoch: max_steps=%d, steps_per_job=%d",
                     trainer.epochs, trainer.epochs_per_job, per_epoch, trainer.max_steps, trainer.steps_per_job)

    def _build_loaders(self) -> None:
        self.sampler.set_position(self.progress.epoch, self.progress.batch_in_epoch)
        self.loader, self.valid_loader = build_loaders(self.train_set, self.valid_set, self.sampler, self.cfg.data,
                                                       self.cfg.trainer.batch_size)

    # ----------------------------------------------------------- checkpoints
    @property
    def step(self) -> int:
        return self.progress.step

    def save(self) -> Path:
        state = training_state(
            self.model, self.optimizer, self.scheduler, self.ema, self.progress,
            OmegaConf.to_yaml(self.cfg), self.learned.checkpoint_state() if self.learned is not None else None,
        )
        path = self.checkpoints.save(self.step, state)
        log.info("saved checkpoint %s", path)
        return path

    def load(self, path: Path) -> None:
        check_resume_config(self.cfg, path)  # a differing model: one line, before any load
        run = ResumedRun(
            self.model, self.optimizer, self.scheduler, self.ema,
            self.sampler.global_batch_size, self.sampler.batches_per_epoch,
            self.learned.checkpoint_state() if self.learned is not None else None,
        )
        self.progress = resume_training(path, run)
        if self.learned is not None:
            self.learned.restore(run.loss_state)
        self._apply_config_hyperparameters()
        choose_foreach(self.model, self.optimizer)  # the checkpoint's groups carry the saving run's flag

    def _start_from_credit(self) -> None:
        start, trainer = self.cfg.trainer.credit_start, self.cfg.trainer
        run = ResumedRun(self.model, self.optimizer, self.scheduler, self.ema,
                         self.sampler.global_batch_size, self.sampler.batches_per_epoch)
        self.progress = start_from_credit(start.checkpoint, start.optimizer, start.reload_epoch, run,
                                          fsdp=start.fsdp)
        self.scheduler = lambda_schedule(self.optimizer, schedule_function(
            trainer.scheduler, trainer.max_steps, self.sampler.batches_per_epoch), step=self.step)
        choose_foreach(self.model, self.optimizer)

    def _report_skipped(self) -> None:
        """data.nonfinite=skip_sample: how many training samples this job passed over."""
        if self.cfg.data.nonfinite != "skip_sample":
            return
        total = torch.tensor(self.skipped_samples, dtype=torch.int64, device=self.runtime.device)
        if self.runtime.mesh is not None:  # dp replicas read different samples; tp peers the same
            dist.all_reduce(total, group=self.runtime.mesh["dp"].get_group())
        if self.runtime.is_main:
            log.warning("data.nonfinite=skip_sample: %d training samples with non-finite values were "
                        "skipped in this job (each replaced by the next finite one)", int(total))

    def _apply_config_hyperparameters(self) -> None:
        """The config wins on resume (`credit.train.resume_config`): one log line per changed value."""
        self.scheduler, changes = apply_config_hyperparameters(
            self.optimizer, self.scheduler, self.cfg.trainer, self.sampler.batches_per_epoch, self.step)
        if self.runtime.is_main:
            for key, (before, now) in changes.items():
                log.info("resume: %s %s -> %s (the config wins; checkpoint value replaced)", key, before, now)

    # ------------------------------------------------------------------ step
    def _advance_position(self) -> None:
        p = self.progress
        p.batch_in_epoch += 1
        if p.batch_in_epoch == self.sampler.batches_per_epoch:
            p.epoch, p.batch_in_epoch = p.epoch + 1, 0

    def train_step(self, batches: Iterator[dict[str, torch.Tensor]]) -> StepResult:
        """One optimizer step over `trainer.grad_accum_steps` micro-batches."""
        trainer, rt = self.cfg.trainer, self.runtime
        started = time.perf_counter()
        # fast dropout draws from this stream: member blocks of one sample (ens ranks) differ
        seed_for_step(trainer.seed, rt.dp_rank * rt.ens_size + rt.ens_rank, self.step)
        if self.sdc is not None:
            self.sdc.begin_step(self.step + 1)
        self.optimizer.zero_grad(set_to_none=True)
        if self.learned is not None:
            self.learned.zero_grad()
        advance_spectral_norm(self.model)  # u, v advance in this step's first training forward
        losses, self._step_batches = [], []
        for micro in range(trainer.grad_accum_steps):
            host_batch = next(batches)
            self.skipped_samples += int(host_batch["skipped"].sum())  # data.nonfinite=skip_sample
            batch = {k: v.to(rt.device) for k, v in host_batch.items()}
            self._step_batches.append(batch)
            self._advance_position()
            # Indexed dropout (deterministic mode) keys its masks on the global row, an
            # ensemble's (sample, member) pair; the context spans backward too, where
            # activation checkpointing recomputes them.
            samples, here = batch["state"].shape[0], trainer.ensemble_size // rt.ens_size
            first_row = (micro * rt.dp_size + rt.dp_rank) * samples * trainer.ensemble_size
            block = MemberBlock(trainer.ensemble_size, here, rt.ens_rank * here) if rt.ens_size > 1 else None
            with dropout_step(trainer.seed, self.step, first_row, samples * here, block):
                losses.append(self._backward(with_members(batch, here)))
        loss_value = step_loss(losses, self._loss_scale, self.runtime.mesh, self.deterministic,
                               self.runtime.device)  # every rank agrees before deciding
        # the learned weights' penalty: once a forecast step (their mean: once; their sum: forecast_len)
        penalty_terms = self.cfg.data.forecast_len if trainer.loss.forecast_steps == "sum" else 1
        if self.learned is not None and self.deterministic:  # the sums hold the data term only
            loss_value += penalty_terms * float(self.learned.penalty())
        if not math.isfinite(loss_value):
            return self._non_finite(loss_value, started)
        lr = self.scheduler.get_last_lr()[0]
        grad_norm = float(update_parameters(self.model, self.optimizer, rt.mesh, deterministic=self.deterministic,
                                            data=trainer.parallelism.data, grad_clip=trainer.grad_clip,
                                            dynamic_scale=self._dynamic_clip_scale))
        if self.learned is not None:  # deterministic mode: their gradient made here, in a fixed order
            self.learned.step(rt.mesh, self.deterministic, penalty_terms)
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update(self.model)
        self.progress.step += 1
        report = self.sdc.end_step() if self.sdc is not None else StepReport()
        return StepResult(loss_value, grad_norm, lr, time.perf_counter() - started, report)

    def _non_finite(self, loss_value: float, started: float) -> StepResult:
        """A non-finite loss: corrupted data if this step's checks say so (then the SDC action
        decides, the update unapplied), else a diverging run."""
        report = self.sdc.end_step() if self.sdc is not None else StepReport()
        if report.mismatches and self.cfg.diagnostics.sdc.action != "warn":
            self.progress.step += 1
            return StepResult(loss_value, math.nan, self.scheduler.get_last_lr()[0],
                              time.perf_counter() - started, report)
        cause = (f"; this step's checks found corrupted data in {', '.join(report.corrupted_layers)} "
                 f"({self.run_dir / 'sdc.jsonl'})" if report.mismatches else "")
        finite = all(bool(torch.isfinite(batch[key]).all()) for batch in self._step_batches
                     for key in ("state", "forcing", "static", "target"))
        inputs = ("the step's inputs and targets were all finite" if finite else
                  "the step's inputs or targets held non-finite values (check the data files)")
        explain = getattr(self.loss_fn.computed, "why_not_finite", None)  # a computed variable's own reason
        computed = explain() if explain is not None else None
        if computed is not None:
            inputs = f"{inputs}; {computed}"
        raise FloatingPointError(f"loss became {loss_value} at step {self.step + 1} ({inputs}); lower "
                                 f"trainer.optimizer.lr or enable trainer.grad_clip{cause}")

    def _backward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns what `step_loss` combines:
        the micro-batch's mean loss, or in deterministic mode its per-sample sums."""
        accum = self.cfg.trainer.grad_accum_steps
        loss, self._loss_scale = backward_micro_batch(
            self.model, batch, self.train_loss, accum=accum, deterministic=self.deterministic,
            step_samples=self.sampler.global_batch_size * accum,
            forecast_steps=self.cfg.trainer.loss.forecast_steps, ensemble_ranks=self.runtime.ens_size)
        return loss

    def validate(self) -> dict[str, float]:
        return evaluate(
            self.model,
            self.valid_loader,
            channel_variables=self.channel_variables,
            target_std=self.valid_set.target_std,
            target_mean=self.valid_set.target_mean,
            output_inverse=self.valid_set.output_inverse,
            lat_weights=self.lat_weights,
            loss_fn=self.valid_loss_fn.sample_mean if self.deterministic else self.valid_loss_fn,
            state_channels=self.state_channels,
            device=self.runtime.device,
            members=self.cfg.trainer.ensemble_size,
            seed=self.cfg.trainer.seed,
        )

    # ------------------------------------------------------------------ loop
    def _due(self, every: int, last: bool) -> bool:
        return last or bool(every and self.step % every == 0)

    def _open_metrics(self) -> MetricsLog | None:
        """Rank 0 writes the resolved config and (re)opens metrics.csv at this step."""
        if not self.runtime.is_main:
            return None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(self.cfg))
        variables = list(dict.fromkeys(self.channel_variables))
        extra = list(SDC_COLUMNS) if self.sdc is not None else []
        if self.cfg.trainer.ensemble_size > 1:
            extra += [f"spread_{v}" for v in variables]  # validation's members' spread
        if self.learned is not None:
            extra += [f"log_variance_{v}" for v in self.learned.variables]  # the learned s_v after each step
        return MetricsLog(self.run_dir / "metrics.csv", variables, self.step or None, extra)

    def fit(self) -> dict[str, float]:
        """Train to `trainer.max_steps` (or `steps_per_job` more steps); return the final
        validation metrics."""
        trainer = self.cfg.trainer
        metrics = self._open_metrics()
        n_params = sum(p.numel() for p in self.model.parameters())
        log.info(
            "training %s (%.2fM parameters) on %s from step %d to %d; %d training samples",
            self.cfg.model.name, n_params / 1e6, self.runtime.device, self.step,
            trainer.max_steps, len(self.train_set),
        )
        if trainer.ensemble_size > 1:
            ens = self.runtime.ens_size
            where = (f"spread over {ens} ranks ({trainer.ensemble_size // ens} a rank; trainer.parallelism.ensemble)"
                     if ens > 1 else "on the batch axis")
            log.info("an ensemble of %d members a sample %s, scored by %s; validation's RMSE is the "
                     "ensemble mean's", trainer.ensemble_size, where, trainer.loss.function)
        stop_at = trainer.max_steps
        if trainer.steps_per_job:  # wall-clock-limited jobs: the next submission resumes
            stop_at = min(stop_at, self.step + trainer.steps_per_job)
        progress = TrainingProgress(
            trainer.max_steps, self.step, self.runtime.is_main and trainer.progress_bar,
            trainer.log_every_n_steps,
        )
        samples = self.sampler.global_batch_size * trainer.grad_accum_steps
        batches = recycled(self.loader)
        results: dict[str, float] = {}
        sdc = SDCResponse(self.cfg.diagnostics.sdc.action, self.step, self.run_dir / "sdc.jsonl",
                           self.runtime.is_main)
        self.model.train()
        memory = PeakMemory(self.runtime.device)
        while self.step < stop_at:
            result = self.train_step(batches)
            peak, reserved = memory.read_max()  # every rank: one all-reduce (max)
            row = dict(step=self.step, epoch=self.progress.epoch, split="train",
                       loss=result.loss, grad_norm=result.grad_norm, lr=result.lr,
                       samples_per_s=samples / result.seconds, peak_mem_mib=mib(peak),
                       peak_reserved_mib=mib(reserved))
            if self.sdc is not None:
                row.update(sdc.columns(result.sdc))
            if self.learned is not None:
                row.update(self.learned.columns())
            if metrics is not None:
                metrics.log(row)
            progress.update(self.step, result.loss, row["samples_per_s"], row["peak_mem_mib"])
            rollback_to = sdc.after_step(self.step, result.sdc, self.checkpoints)  # or raises
            if rollback_to is not None:  # replay from a verified checkpoint, skipping nothing
                self.sdc.note({"event": "rollback", "step": self.step, "checkpoint": str(rollback_to)})
                self.load(rollback_to)
                self._build_loaders()
                batches, metrics = recycled(self.loader), self._open_metrics()
                continue
            last = self.step == stop_at
            if self._due(trainer.valid_every_n_steps, last):
                results = self.validate()
                if metrics is not None:
                    metrics.log({"step": self.step, "epoch": self.progress.epoch,
                                 "split": "valid", **results})
            if self._due(trainer.checkpoint.every_n_steps, last):
                self.save()
        progress.close()
        self._report_skipped()
        if metrics is not None:
            plot_loss(metrics.path, self.run_dir / "loss.png")
        return results or self.validate()  # resumed at max_steps: still report skill
