"""Continue a CREDIT training run: its `checkpoint.pt` as this run's starting state.

CREDIT's trainer saves `{epoch, model_state_dict, optimizer_state_dict, scheduler_state_dict,
scaler_state_dict}` from one process. Its optimizer state is torch's AdamW state dict, keyed
by each parameter's position in CREDIT's `model.parameters()`, which is the order of the
model state dict's parameter entries (spectral norm registers `weight_orig` after `bias`, and
the state dict keeps that order). So position k is the k-th entry that is a parameter: the
entries that map (`remap_conv_state_dict`) onto this model's parameters, plus CREDIT's unused
`cube_embedding` ones, which hold no state (they never get a gradient) and have no
counterpart here. The moments go through the same remap as the weights (a fused q/k/v's
thirds), then `set_optimizer_state_dict` places each rank's shard: any dp x tp layout.

Where the run continues (CREDIT's `reload_epoch`): after the number of optimizer steps the
checkpoint's AdamW state counts, which is where the schedule resumes. CREDIT itself resumes
its schedule with the first step's lr left at the scheduler's initial value (0 for a
warm-up from zero); here every step gets the schedule's value for its step, as an
uninterrupted run would.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

from credit.checkpoint.manager import CheckpointError
from credit.checkpoint.weights import load_weights_file
from credit.models.credit.checkpoint import (
    CreditCheckpointError,
    is_unused_credit_key,
    read_credit_checkpoint,
    unwrapped_name,
)
from credit.models.credit.remap import remap_conv_state_dict

log = logging.getLogger(__name__)

_POWER_ITERATION_VECTORS = (".weight_u", ".weight_v")  # spectral norm's buffers, never optimized


@dataclass
class CreditStart:
    """What was taken from CREDIT's checkpoint."""

    steps: int  # optimizer steps CREDIT took (its AdamW step count)
    epoch: int  # the epoch CREDIT finished last (its `epoch`)
    optimizer_loaded: bool


def parameter_order(entries: Mapping[str, torch.Tensor], parameters: set[str]) -> list[tuple[str, list[str]]]:
    """For each position of CREDIT's optimizer state, CREDIT's entry and the parameter names
    it becomes here: one name, three for a fused q/k/v, none for an unused `cube_embedding`
    parameter."""
    order: list[tuple[str, list[str]]] = []
    for key, tensor in entries.items():
        if key.endswith(_POWER_ITERATION_VECTORS):
            continue
        if is_unused_credit_key(key):
            order.append((key, []))
            continue
        names = list(remap_conv_state_dict({key: tensor}))
        if any(name in parameters for name in names):
            order.append((key, names))
    return order


def _moments(order: list[tuple[str, list[str]]],
             state: Mapping[int, Mapping[str, Any]]) -> dict[str, dict[str, torch.Tensor]]:
    """CREDIT's per-position AdamW state as this model's, keyed by parameter name."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for position, (key, names) in enumerate(order):
        if position not in state or not names:
            continue
        entry = state[position]
        for moment in ("exp_avg", "exp_avg_sq"):  # the weights' remap: a fused q/k/v in thirds
            for name, value in remap_conv_state_dict({key: entry[moment]}).items():
                out.setdefault(name, {})[moment] = value.float()
        for name in names:
            out[name]["step"] = torch.as_tensor(entry["step"], dtype=torch.float32).clone()
    return out


def _parameter_names(model: nn.Module) -> list[str]:
    return [unwrapped_name(name) for name, _ in model.named_parameters()]


def _moments_by_name(state: Mapping[str, Mapping[str, Any]], parameters: set[str],
                     path: Path) -> dict[str, dict[str, torch.Tensor]]:
    """FSDP1's full optimizer state (keyed by parameter name) as this model's."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, entry in state.items():
        key = unwrapped_name(key)
        if is_unused_credit_key(key):
            continue
        for moment in ("exp_avg", "exp_avg_sq"):
            for name, value in remap_conv_state_dict({key: entry[moment]}).items():
                if name not in parameters:
                    raise CheckpointError(f"{path}: optimizer state for {key!r}, which names no parameter of "
                                          f"this model")
                out.setdefault(name, {})[moment] = value.float()
        for name in remap_conv_state_dict({key: entry["exp_avg"]}):
            out[name]["step"] = torch.as_tensor(entry["step"], dtype=torch.float32).clone()
    return out


def _read(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged or foreign file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CheckpointError(f"{path}: not a readable torch checkpoint with weights_only=True "
                              f"({type(exc).__name__}: {first})") from None


def load_credit_training_state(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                               with_optimizer: bool, fsdp: bool = False) -> CreditStart:
    """Load CREDIT's `checkpoint.pt` weights (and, `with_optimizer`, its AdamW state) into
    this run's model and optimizer, in any layout. With `fsdp` (CREDIT's `trainer.mode:
    fsdp`), the weights come from `model_checkpoint.pt` and the AdamW state from
    `optimizer_checkpoint.pt` beside it, keyed by parameter name as FSDP's full state dicts
    are; `checkpoint.pt` holds the epoch. Raises CheckpointError naming the file."""
    path = Path(path)
    weights = path.with_name("model_checkpoint.pt") if fsdp else path
    optimizer_file = path.with_name("optimizer_checkpoint.pt") if fsdp else path
    try:
        container, entries = read_credit_checkpoint(weights)
    except CreditCheckpointError as error:
        raise CheckpointError(str(error)) from None
    if fsdp:  # checkpoint.pt: the epoch, schedule and scaler; FSDP's full optimizer state beside it
        # (only the weights are needed without load_optimizer: step counts then start at 0)
        container = _read(path)
        optim_state = _read(optimizer_file) if with_optimizer or optimizer_file.exists() else {"state": {}}
        missing = "not FSDP's full optimizer state dict (state, param_groups), which CREDIT's fsdp mode saves"
    else:
        optim_state = container.get("optimizer_state_dict")
        missing = "no optimizer_state_dict; CREDIT's trainer saves one in checkpoint.pt"
    if not isinstance(optim_state, Mapping) or not isinstance(optim_state.get("state"), Mapping):
        raise CheckpointError(f"{optimizer_file}: {missing} (a weights-only file starts a run with "
                              f"trainer.resume={weights})")
    state, groups = optim_state["state"], list(optim_state.get("param_groups") or [])
    steps = {int(float(entry["step"])) for entry in state.values() if "step" in entry}
    load_weights_file(model, weights)
    if with_optimizer:
        names = _parameter_names(model)
        if fsdp:
            if len(groups) != 1:
                raise CheckpointError(f"{optimizer_file}: its optimizer state has {len(groups)} parameter groups; "
                                      f"CREDIT's AdamW holds every parameter in one")
            moments = _moments_by_name(state, set(names), optimizer_file)
        else:
            order = parameter_order(entries, set(names))
            positions = sum(len(group["params"]) for group in groups)
            if len(groups) != 1 or positions != len(order):
                raise CheckpointError(
                    f"{path}: its optimizer state has {positions} parameter positions in {len(groups)} group(s), "
                    f"but its model state lists {len(order)} parameters; CREDIT's AdamW holds every parameter "
                    f"in one group, so this file's optimizer state cannot be matched to the weights")
            moments = _moments(order, {int(k): v for k, v in state.items()})
        own = dict(optimizer.param_groups[0])
        own.pop("params")
        full = {"state": moments, "param_groups": [{**own, "params": names}]}
        set_optimizer_state_dict(model, optimizer, full, options=StateDictOptions(full_state_dict=True))
    epoch = int(container.get("epoch", -1)) if isinstance(container, Mapping) else -1
    if len(steps) > 1:
        log.warning("%s: its parameters count different AdamW steps %s; continuing after %d", optimizer_file,
                    sorted(steps), max(steps))
    return CreditStart(steps=max(steps, default=0), epoch=epoch, optimizer_loaded=with_optimizer)
