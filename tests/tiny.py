"""Sizes for seconds-long training runs on the tiny generated dataset (shared by all tests)."""

from __future__ import annotations

from pathlib import Path

TINY_LEVELS = [500, 850]
# `model.*` of the tiny windowformer as a mapping, for building it without hydra
SMALL_MODEL = dict(
    dim=[16, 32],
    depth=[1, 1],
    dim_head=8,
    local_window_size=[2, 2],
    global_window_size=[2, 2],
    cross_embed_kernel_sizes=[[2, 4], [2, 4]],
    cross_embed_strides=[2, 2],
)
TINY_MODEL = [
    "model=windowformer",
    "model.dim=[16,32]",
    "model.depth=[1,1]",
    "model.dim_head=8",
    "model.local_window_size=[2,2]",
    "model.global_window_size=[2,2]",
    "model.cross_embed_kernel_sizes=[[2,4],[2,4]]",
    "model.cross_embed_strides=[2,2]",
]


def tiny_overrides(data_root: Path | str, *extra: str) -> list[str]:
    """Overrides for the tiny model on the tiny dataset; later entries win."""
    return [*TINY_MODEL, *tiny_data_overrides(data_root, *extra)]


def tiny_data_overrides(data_root: Path | str, *extra: str) -> list[str]:
    """Overrides for the tiny dataset and short runs, the model left at its defaults."""
    return [
        f"data.root={data_root}",
        "data.generate_if_missing=false",
        f"data.levels=[{','.join(str(v) for v in TINY_LEVELS)}]",
        "data.train_period=[2000-01-01,2000-01-12]",
        "data.valid_period=[2001-01-01,2001-01-12]",
        "data.valid_samples=8",
        "trainer.batch_size=4",
        "trainer.progress_bar=false",
        "trainer.scheduler.warmup_steps=2",
        "trainer.optimizer.lr=2e-3",
        *extra,
    ]
