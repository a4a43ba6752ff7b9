"""The model's input tensor from a dataset sample: training, validation and rollout share it."""

from __future__ import annotations

import torch


def model_input(state: torch.Tensor, forcing: torch.Tensor, static: torch.Tensor) -> torch.Tensor:
    """(B, history_len, C_state, H, W) frames + (B, C_f, H, W) forcing at the predicted time
    + (B, C_s, H, W) static -> (B, C_in, H, W) in the order the model documents."""
    frames = state.flatten(1, 2)
    return torch.cat([frames, forcing, static], dim=1)
