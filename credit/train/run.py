"""Run a validated config as a training job in this process (one rank of a launch, or alone)."""

from __future__ import annotations

import logging

import torch.distributed as dist
from omegaconf import DictConfig

from credit.logs import configure_logging
from credit.parallel import build_runtime, shutdown
from credit.train.run_lock import run_dir_lock
from credit.train.trainer import Trainer

log = logging.getLogger(__name__)


def skill_table(results: dict[str, float]) -> str:
    """Final validation as a table: model vs persistence RMSE per variable."""
    names = [k[len("rmse_"):] for k in results if k.startswith("rmse_")]
    width = max([12, *(len(name) + 1 for name in names)])  # ERA5's long names keep the columns
    lines = [f"{'variable':<{width}}{'model RMSE':>14}{'persistence':>14}  skill vs persistence"]
    for name in names:
        model = results[f"rmse_{name}"]
        persistence = results.get(f"persistence_rmse_{name}")
        if persistence is None:
            lines.append(f"{name:<{width}}{model:>14.5g}{'-':>14}  (diagnostic)")
        else:
            verdict = "better" if model < persistence else "WORSE"
            lines.append(
                f"{name:<{width}}{model:>14.5g}{persistence:>14.5g}  {1 - model / persistence:+.1%} {verdict}"
            )
    return "\n".join(lines)


def run_training(cfg: DictConfig) -> dict[str, float]:
    """Train on `cfg` (already validated) as this process's rank; return final validation."""
    runtime = build_runtime(cfg)
    configure_logging(rank=runtime.rank)
    if runtime.layout is not None:
        lay = runtime.layout
        ens = f" x ens {lay.ens}" if lay.ens > 1 else ""
        log.info("mesh: world %d = dp %d%s x tp %d, data parallel: %s, process groups: %s",
                 lay.world_size, lay.dp, ens, lay.tp, lay.data, dist.get_backend())
    try:
        with run_dir_lock(cfg.run_dir, runtime.is_main):  # one job per run_dir, before any write
            trainer = Trainer(cfg, runtime)
            trainer.setup()
            results = trainer.fit()
    finally:
        shutdown()
    if runtime.is_main:
        log.info("final validation (lead 6 h, physical units):\n%s", skill_table(results))
        log.info("results in %s (metrics.csv, loss.png, config.yaml, checkpoints/)", cfg.run_dir)
    return results
