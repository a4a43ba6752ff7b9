"""The training loop: data -> model -> loss -> step -> metrics -> checkpoint.

Written for one process today and for the (dp, tp) mesh tomorrow: the sampler shards
by data-parallel rank only, only rank 0 writes files, and every checkpoint is a sharded
DCP directory.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader
from tqdm import tqdm

from credit.checkpoint.legacy import load_model_weights
from credit.checkpoint.manager import CheckpointManager
from credit.checkpoint.training_state import Progress, restore_training_state, training_state
from credit.data import DPShardedBatchSampler
from credit.models import build_model
from credit.parallel import (
    clip_grad_norm_,
    parallelize_model,
    seed_for_init,
    seed_for_runtime,
    sync_replicated_gradients,
)
from credit.train.data import build_dataset, ensure_dataset, model_layout
from credit.train.ema import EMA
from credit.train.forecast import forecast_loss
from credit.train.losses import WeightedMSE, channel_weights, latitude_weights
from credit.train.metrics import MetricsLog, plot_loss
from credit.train.runtime import Runtime
from credit.train.schedule import warmup_cosine
from credit.train.validation import evaluate, evenly_spaced, output_channel_variables

log = logging.getLogger(__name__)


class _Batches:
    """Endless batch-index stream for a DataLoader, starting at the sampler's position."""

    def __init__(self, sampler: DPShardedBatchSampler) -> None:
        self.sampler = sampler

    def __iter__(self):
        for _, _, indices in self.sampler.iterate_forever():
            yield indices


class Trainer:
    def __init__(self, cfg: DictConfig, runtime: Runtime) -> None:
        self.cfg = cfg
        self.runtime = runtime
        self.run_dir = Path(cfg.run_dir)
        self.checkpoints = CheckpointManager(
            self.run_dir / "checkpoints", cfg.trainer.checkpoint.keep_latest_k
        )

    # ----------------------------------------------------------------- setup
    def _decide_resume(self) -> tuple[str, str | None]:
        """("resume", path), ("fresh", None) or ("refuse", why), judged from the files."""
        resume = self.cfg.trainer.resume
        latest = self.checkpoints.latest()
        if resume == "never":
            if latest is not None or (self.run_dir / "metrics.csv").exists():
                return "refuse", (
                    f"run_dir {self.run_dir} already holds a run; trainer.resume=never would "
                    f"overwrite it: use trainer.resume=auto to continue it or choose another run_dir"
                )
            return "fresh", None
        if resume == "auto":
            return ("resume", str(latest)) if latest is not None else ("fresh", None)
        return "resume", resume

    def _resume_source(self) -> Path | None:
        # Rank 0 decides for everyone: a slower rank must not look at the run directory
        # after rank 0 has started writing into it.
        decision = [self._decide_resume() if self.runtime.is_main else None]
        if dist.is_available() and dist.is_initialized():
            dist.broadcast_object_list(decision, src=0)
        verdict, detail = decision[0]
        if verdict == "refuse":
            raise FileExistsError(detail)
        return Path(detail) if verdict == "resume" else None

    def setup(self) -> None:
        cfg, rt = self.cfg, self.runtime
        data = cfg.data
        ensure_dataset(data, rt.is_main)
        self.train_set = build_dataset(data, "train_period")
        self.valid_set = build_dataset(data, "valid_period")
        variables = data.variables
        self.channel_variables = output_channel_variables(
            variables.upper_air, data.levels, variables.surface, variables.diagnostic
        )
        self.state_channels = len(self.train_set.state_channel_names)

        # fully_shard does not broadcast weights: every rank builds identical full weights.
        seed_for_init(cfg.trainer.seed)
        self.model = build_model(cfg.model, **model_layout(data, self.train_set)).to(rt.device)
        if rt.mesh is not None:
            par = cfg.trainer.parallelism
            parallelize_model(
                self.model,
                rt.mesh,
                par.data,
                activation_checkpointing=par.activation_checkpointing,
                mixed_precision=par.mixed_precision,
            )
        # Runtime randomness differs per data-parallel replica, never across tp peers.
        seed_for_runtime(cfg.trainer.seed, rt.dp_rank)

        opt = cfg.trainer.optimizer
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=opt.lr,
            betas=tuple(opt.betas),
            eps=opt.eps,
            weight_decay=opt.weight_decay,
        )
        sched = cfg.trainer.scheduler
        self.scheduler = warmup_cosine(
            self.optimizer, sched.warmup_steps, cfg.trainer.max_steps, sched.min_lr_ratio
        )
        lat_w = latitude_weights(self.train_set.latitude)
        if not cfg.trainer.loss.latitude_weighting:
            lat_w = torch.ones_like(lat_w)
        self.lat_weights = lat_w
        self.loss_fn = WeightedMSE(
            lat_w, channel_weights(self.channel_variables, cfg.trainer.loss.variable_weights)
        ).to(rt.device)

        self.sampler = DPShardedBatchSampler(
            len(self.train_set),
            cfg.trainer.batch_size,
            dp_rank=rt.dp_rank,
            dp_size=rt.dp_size,
            seed=cfg.trainer.seed,
        )
        ema = cfg.trainer.ema
        self.ema = EMA(self.model, ema.decay) if ema.enabled else None
        global_batch = cfg.trainer.batch_size * rt.dp_size
        self.progress = Progress(global_batch_size=global_batch)
        source = self._resume_source()
        if source is not None:
            self.load(source)
        self.sampler.set_position(self.progress.epoch, self.progress.batch_in_epoch)
        self.loader = DataLoader(
            self.train_set,
            batch_sampler=_Batches(self.sampler),
            num_workers=data.num_workers,
            persistent_workers=data.num_workers > 0,
        )
        valid_indices = evenly_spaced(data.valid_samples, len(self.valid_set))
        self.valid_loader = DataLoader(
            torch.utils.data.Subset(self.valid_set, valid_indices),
            batch_size=cfg.trainer.batch_size,
            shuffle=False,
            num_workers=0,
        )

    # ----------------------------------------------------------- checkpoints
    @property
    def step(self) -> int:
        return self.progress.step

    def save(self) -> Path:
        state = training_state(
            self.model, self.optimizer, self.scheduler, self.ema, self.progress,
            self.runtime.rank, OmegaConf.to_yaml(self.cfg),
        )
        path = self.checkpoints.save(self.step, state)
        log.info("saved checkpoint %s", path)
        return path

    def load(self, path: Path) -> None:
        if load_model_weights(self.model, path):
            # a single file (legacy layout remapped) or a weights-only DCP directory: there is
            # no optimizer state to map, so the run starts at step 0 from these weights
            if self.ema is not None:
                with torch.no_grad():
                    for name, param in self.model.named_parameters():
                        self.ema.shadow[name].copy_(param)
            log.warning(
                "loaded model weights only from %s: its optimizer state cannot be mapped, so "
                "the optimizer and scheduler start fresh at step 0", path,
            )
            return
        saved = restore_training_state(
            path, self.model, self.optimizer, self.scheduler, self.ema, self.runtime.rank
        )
        global_batch = self.cfg.trainer.batch_size * self.runtime.dp_size
        self.progress = saved.rescaled(global_batch, self.sampler.batches_per_epoch)
        if saved.global_batch_size != global_batch:
            log.warning(
                "resuming with %d samples per global batch instead of %d: the epoch continues "
                "from sample %d of its order", global_batch, saved.global_batch_size,
                self.progress.batch_in_epoch * global_batch,
            )
        log.info("resumed from %s at step %d", path, self.step)

    # ------------------------------------------------------------------ loop
    def _advance_position(self) -> None:
        p = self.progress
        p.batch_in_epoch += 1
        if p.batch_in_epoch == self.sampler.batches_per_epoch:
            p.epoch, p.batch_in_epoch = p.epoch + 1, 0

    def _mean_over_dp(self, value: float) -> float:
        """The loss averaged over data-parallel replicas (tp peers already agree)."""
        mesh = self.runtime.mesh
        if mesh is None or mesh["dp"].size() == 1:
            return value
        total = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(total, group=mesh["dp"].get_group())
        return float(total) / mesh["dp"].size()

    def validate(self) -> dict[str, float]:
        return evaluate(
            self.model,
            self.valid_loader,
            channel_variables=self.channel_variables,
            target_std=self.valid_set.target_std,
            lat_weights=self.lat_weights,
            loss_fn=self.loss_fn,
            state_channels=self.state_channels,
            device=self.runtime.device,
        )

    def _write_config(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(self.cfg))

    def fit(self) -> dict[str, float]:
        """Train to `trainer.max_steps`; return the final validation metrics."""
        cfg, rt = self.cfg, self.runtime
        trainer = cfg.trainer
        resumed_at = self.step if self.step > 0 else None
        metrics = None
        if rt.is_main:
            self._write_config()
            metrics = MetricsLog(
                self.run_dir / "metrics.csv", list(dict.fromkeys(self.channel_variables)), resumed_at
            )
        n_params = sum(p.numel() for p in self.model.parameters())
        log.info(
            "training %s (%.2fM parameters) on %s from step %d to %d; %d training samples",
            cfg.model.name, n_params / 1e6, rt.device, self.step, trainer.max_steps,
            len(self.train_set),
        )
        batches = iter(self.loader)
        bar = tqdm(
            total=trainer.max_steps,
            initial=self.step,
            desc="train",
            disable=not (rt.is_main and trainer.progress_bar),
            mininterval=1.0,
        )
        self.model.train()
        results: dict[str, float] = {}
        stop_at = trainer.max_steps
        if trainer.steps_per_job:  # wall-clock-limited jobs: the next submission resumes
            stop_at = min(stop_at, self.step + trainer.steps_per_job)
        while self.step < stop_at:
            started = time.perf_counter()
            self.optimizer.zero_grad(set_to_none=True)
            loss_value = 0.0
            for _ in range(trainer.grad_accum_steps):
                batch = {k: v.to(rt.device) for k, v in next(batches).items()}
                self._advance_position()
                loss = forecast_loss(self.model, batch, self.loss_fn)
                (loss / trainer.grad_accum_steps).backward()
                loss_value += loss.item() / trainer.grad_accum_steps
            loss_value = self._mean_over_dp(loss_value)  # every rank agrees before deciding
            if not math.isfinite(loss_value):
                raise FloatingPointError(
                    f"loss became {loss_value} at step {self.step + 1}; lower "
                    f"trainer.optimizer.lr or enable trainer.grad_clip"
                )
            if rt.mesh is not None:
                sync_replicated_gradients(self.model, rt.mesh["tp"])
            max_norm = trainer.grad_clip if trainer.grad_clip > 0 else math.inf
            grad_norm = float(clip_grad_norm_(self.model.parameters(), max_norm))
            lr = self.scheduler.get_last_lr()[0]
            self.optimizer.step()
            self.scheduler.step()
            if self.ema is not None:
                self.ema.update(self.model)
            self.progress.step += 1
            elapsed = time.perf_counter() - started
            samples = trainer.batch_size * trainer.grad_accum_steps * rt.dp_size
            if metrics is not None:
                metrics.log(
                    {
                        "step": self.step,
                        "epoch": self.progress.epoch,
                        "split": "train",
                        "loss": loss_value,
                        "grad_norm": grad_norm,
                        "lr": lr,
                        "samples_per_s": samples / elapsed,
                    }
                )
            bar.update(1)
            bar.set_postfix(loss=f"{loss_value:.4f}", refresh=False)
            last = self.step == stop_at
            every_valid = trainer.valid_every_n_steps
            if last or (every_valid and self.step % every_valid == 0):
                results = self.validate()
                if metrics is not None:
                    metrics.log(
                        {"step": self.step, "epoch": self.progress.epoch, "split": "valid", **results}
                    )
            every_ckpt = trainer.checkpoint.every_n_steps
            if last or (every_ckpt and self.step % every_ckpt == 0):
                self.save()
        bar.close()
        if rt.is_main and (self.run_dir / "metrics.csv").exists():
            plot_loss(self.run_dir / "metrics.csv", self.run_dir / "loss.png")
        if not results:  # resumed at max_steps: nothing trained, still report skill
            results = self.validate()
        return results
