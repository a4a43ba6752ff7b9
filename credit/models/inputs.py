"""The model's input from a dataset sample, and one forecast step: training, validation and
rollout share them.

Two layouts, declared by the model class's `input_layout`:
- the windowformer's (default): (B, C_in, H, W) = history frames of the state, the forcing at
  the predicted time, the static fields; output (B, C_out, H, W).
- CREDIT's (`"credit"`): (B, C, T, H, W) with, in every frame t, the state at t, the
  forcing at t and the static fields (CREDIT's channel order: upper-air variables
  variable-major and level-minor, surface, then the input-only forcing and static
  variables); output (B, C_out, 1, H, W).
"""

from __future__ import annotations

import torch
from torch import nn


def model_input(state: torch.Tensor, forcing: torch.Tensor, static: torch.Tensor) -> torch.Tensor:
    """(B, history_len, C_state, H, W) frames + (B, C_f, H, W) forcing at the predicted time
    + (B, C_s, H, W) static -> (B, C_in, H, W) in the order the windowformer documents."""
    frames = state.flatten(1, 2)
    return torch.cat([frames, forcing, static], dim=1)


def credit_input(state: torch.Tensor, forcing_frames: torch.Tensor, static: torch.Tensor) -> torch.Tensor:
    """(B, T, C_state, H, W) + (B, T, C_f, H, W) forcing at the same times + (B, C_s, H, W)
    static -> CREDIT's (B, C_state + C_f + C_s, T, H, W)."""
    frames = state.shape[1]
    static_frames = static.unsqueeze(1).expand(-1, frames, -1, -1, -1)
    return torch.cat([state, forcing_frames, static_frames], dim=2).transpose(1, 2)


def predict(model: nn.Module, state: torch.Tensor, forcing_window: torch.Tensor,
            static: torch.Tensor, initial_state: torch.Tensor | None = None) -> torch.Tensor:
    """One forecast step in either layout -> (B, C_out, H, W).

    `forcing_window` (B, history_len + 1, C_f, H, W) holds the forcing at the input frames'
    times followed by the predicted time. A CREDIT model's `outside_post_blocks` run after
    it, as CREDIT's trainer and rollout run them: the mass fixer against `initial_state`
    (B, history_len, C_state, H, W), the forecast's first input state (default: `state`).
    """
    if getattr(model, "input_layout", None) == "credit":
        x = credit_input(state, forcing_window[:, : state.shape[1]], static)
        y = model(x)
        outside = getattr(model, "outside_post_blocks", None)
        if outside is not None:
            initial = state if initial_state is None else initial_state
            y = outside(y, x, initial.transpose(1, 2))  # the fixers read the state channels' last frame
        return y[:, :, 0]
    return model(model_input(state, forcing_window[:, -1], static))
