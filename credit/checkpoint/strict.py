"""Strict weight loading: a checkpoint's keys and shapes must match the model's exactly.

Every load path (training resume, single files, weights-only directories, rollout) checks
here first, so a mismatch is one error listing every missing, unexpected and mis-shaped
key, raised before any weight changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from credit.checkpoint.manager import CheckpointError

_LISTED = 10  # names shown per kind of problem; a wholly wrong file would list every parameter


def _listed(names: list[str]) -> str:
    shown = str(names[:_LISTED])
    return shown if len(names) <= _LISTED else f"{shown[:-1]}, ... {len(names) - _LISTED} more]"


def check_weights(
    expected: Mapping[str, tuple[int, ...]], found: Mapping[str, tuple[int, ...]], source: str
) -> None:
    """Raise CheckpointError listing missing/unexpected keys and shape mismatches."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    shapes = sorted(
        f"{k} {tuple(found[k])} (model: {tuple(expected[k])})"
        for k in set(expected) & set(found)
        if tuple(found[k]) != tuple(expected[k])
    )
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing keys {_listed(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected keys {_listed(unexpected)}")
    if shapes:
        problems.append(f"{len(shapes)} wrong shapes {_listed(shapes)}")
    if problems:
        raise CheckpointError(f"{source} does not fit the model (strict load): {'; '.join(problems)}")


def model_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Global shapes of the model's state (a DTensor's shape is global: no communication)."""
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def stored_shapes(path: str | Path, prefix: str) -> dict[str, tuple[int, ...]]:
    """Shapes of the tensors stored under `prefix.` in a DCP directory, keyed without it."""
    metadata = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    return {
        k[len(prefix) + 1 :]: tuple(v.size)
        for k, v in metadata.items()
        if k.startswith(prefix + ".") and isinstance(v, TensorStorageMetadata)
    }


def check_stored_weights(model: nn.Module, path: str | Path, prefix: str = "model") -> None:
    """The `prefix.*` tensors of DCP directory `path` fit `model` exactly, or CheckpointError."""
    check_weights(model_shapes(model), stored_shapes(path, prefix), f"{path} ({prefix} weights)")
