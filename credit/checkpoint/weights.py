"""Bring weights from elsewhere into a run: single-file checkpoints and weights-only DCP.

A single-file checkpoint is one `torch.save` file holding either a dict with
`model_state_dict` or a bare state dict. For CREDIT's models it is read as CREDIT writes it
(`credit.models.credit.checkpoint`: CREDIT's trainer container, FSDP or DDP prefixes, and
CREDIT's older convolutional layout remapped); for the windowformer it must hold the
current layout. It has no optimizer state this code can map onto the current parameters,
so it loads model weights only.

`convert_checkpoint` turns such a file into a weights-only DCP directory: keys `model.*`
(the current layout), `config` (the resolved YAML the model was built from) and `source`
(the file it came from), and no `optim.*` keys. `trainer.resume=` accepts either form;
both start the run at step 0 with a fresh optimizer, scheduler and sampler position.

Every load is strict: missing keys, unexpected keys and shape mismatches are one error
listing them all, before any weight is touched.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from credit.checkpoint.manager import (
    CheckpointError,
    _quiet_single_process,
    checkpoint_keys,
    is_complete_checkpoint,
    load_checkpoint,
)
from credit.checkpoint.strict import check_stored_weights, check_weights, model_shapes
from credit.data import model_layout
from credit.models import build_model
from credit.models.credit.checkpoint import CreditCheckpointError, may_start_fresh, read_credit_state_dict
from credit.models.credit.remap import RemapError, remap_conv_state_dict

log = logging.getLogger(__name__)

_DDP_PREFIX = "module."  # state dicts saved from a DistributedDataParallel wrapper


def read_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """The model state dict stored in a single-file checkpoint, as saved (not remapped).

    Accepts a dict with `model_state_dict`, or a bare state dict (every value a tensor). A
    `module.` prefix on every key (a DistributedDataParallel save) is dropped. The file is
    read with `weights_only=True`: it may hold tensors, numbers, strings and containers.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} is not a file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # unpickling errors come in many types; report the first line
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(
            f"cannot read {path} as a torch.save checkpoint with weights_only=True: {first}"
        ) from None
    if isinstance(payload, Mapping) and "model_state_dict" in payload:
        state = payload["model_state_dict"]
    elif isinstance(payload, Mapping) and payload and all(isinstance(v, torch.Tensor) for v in payload.values()):
        state = payload
    else:
        keys = sorted(payload)[:10] if isinstance(payload, Mapping) else type(payload).__name__
        raise CheckpointError(
            f"{path} holds neither a dict with 'model_state_dict' nor a bare state dict of "
            f"tensors (found {keys})"
        )
    state = dict(state)
    if state and all(k.startswith(_DDP_PREFIX) for k in state):
        state = {k[len(_DDP_PREFIX):]: v for k, v in state.items()}
    return state


def load_weights_file(model: nn.Module, path: str | Path) -> None:
    """Load a single-file checkpoint's weights into `model` (CREDIT's layouts remapped).

    `model` may already be tensor-parallel and/or FSDP2-sharded: every rank reads the file
    and `set_model_state_dict` places each rank's shard. Strict: see `check_weights`.
    """
    try:
        if getattr(model, "input_layout", None) == "credit":  # CREDIT's own checkpoint formats
            state = remap_conv_state_dict(read_credit_state_dict(path))
        else:
            state = read_state_dict_file(path)
    except (RemapError, CreditCheckpointError) as error:
        raise CheckpointError(f"{path}: {error}" if str(path) not in str(error) else str(error)) from None
    shapes = model_shapes(model)
    absent = [k for k in shapes if k not in state]
    strict = not may_start_fresh(model, absent, str(path))
    if not strict:
        shapes = {k: v for k, v in shapes.items() if k not in absent}
    check_weights(shapes, {k: tuple(v.shape) for k, v in state.items()}, str(path))
    set_model_state_dict(
        model, state, options=StateDictOptions(full_state_dict=True, strict=strict)
    )


def is_weights_only_checkpoint(path: str | Path) -> bool:
    """A complete DCP directory holding model weights but no optimizer state."""
    path = Path(path)
    if not is_complete_checkpoint(path):
        return False
    keys = checkpoint_keys(path)
    return any(k.startswith("model.") for k in keys) and not any(k.startswith("optim.") for k in keys)


def load_weights_only_checkpoint(model: nn.Module, path: str | Path) -> None:
    """Load the `model.*` weights of a DCP directory into `model` (any dp x tp layout)."""
    check_stored_weights(model, path)
    state = {"model": get_model_state_dict(model)}
    load_checkpoint(path, state)
    set_model_state_dict(model, state["model"], options=StateDictOptions(strict=True))


def load_model_weights(model: nn.Module, path: str | Path) -> bool:
    """Load weights only when `path` is a single file or a weights-only DCP directory.

    Returns False (nothing loaded) for a full training-state checkpoint, which the caller
    restores with its optimizer, scheduler and progress.
    """
    path = Path(path)
    if path.is_file():
        load_weights_file(model, path)
        return True
    if is_weights_only_checkpoint(path):
        load_weights_only_checkpoint(model, path)
        return True
    return False


def convert_checkpoint(source: str | Path, out: str | Path, cfg: DictConfig) -> Path:
    """Write the weights of single-file checkpoint `source` as a weights-only DCP directory `out`.

    The model is built from `cfg` (`model.*` and the data layout of `cfg.data`), so the
    weights are checked strictly against the model that will train them. Refuses an
    existing `out` (FileExistsError, nothing written); writes into a sibling partial
    directory and renames it into place, so a failed conversion leaves no `out`.
    """
    source, out = Path(source), Path(out)
    if out.exists():
        raise FileExistsError(f"{out} already exists; refusing to overwrite it (choose a new path)")
    if not source.is_file():
        raise FileNotFoundError(f"checkpoint {source} is not a file")
    model = build_model(cfg.model, **model_layout(cfg.data))
    load_weights_file(model, source)
    partial = out.with_name(f".partial_{out.name}")
    if partial.exists():
        shutil.rmtree(partial)
    state = {
        "model": model.state_dict(),
        "config": OmegaConf.to_yaml(cfg),
        "source": str(source.resolve()),
    }
    with _quiet_single_process():
        dcp.save(state, checkpoint_id=str(partial))
    partial.rename(out)
    log.info("converted %s into weights-only DCP checkpoint %s", source, out)
    return out
