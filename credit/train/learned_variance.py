"""Learned variable weights (`trainer.loss.learnable_variance`, CREDIT's BaseLoss
`var_weighting: learnable`): Kendall and Gal's uncertainty weighting, one log-variance s_v
per output variable, trained beside the model.

    L = mean_v( m_v exp(-s_v) L_v + 0.5 s_v )

L_v is the variable's mean error (latitude-weighted, over its levels and grid), m_v its
`trainer.loss.variable_weights` entry (default 1). s_v starts at log(max(var_v, 1e-12)), the
variable's variance in the data's target statistics (the mean over its channels of std²,
as `inverse_variance` reads it), so the first step weighs as `inverse_variance` does.

What CREDIT's trainer does and this module keeps: the s_v take their own AdamW step with the
model's betas, eps and weight decay at the constant `trainer.optimizer.lr` (CREDIT adds them
to its optimizer after the scheduler is built, which then leaves their group's rate alone);
gradient clipping and the EMA see the model's parameters only; validation scores with the
weights of the first step (CREDIT's validation criterion is a second, untrained instance).
Where this differs, on purpose: the s_v gradient is averaged over every rank, the one-process
gradient at the global batch (CREDIT's ranks each step their own copy, which drift apart),
and the s_v and their AdamW moments are checkpointed (CREDIT re-initialises them on resume).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn


class LearnedVariance(nn.Module):
    """The s_v of `channel_variables`' variables, and what turns them into per-channel weights."""

    def __init__(self, channel_variables: Sequence[str], variable_weights: Mapping[str, Any],
                 channel_variance: Sequence[float]) -> None:
        super().__init__()
        names = list(dict.fromkeys(channel_variables))
        self.variables = names
        variance = np.asarray(list(channel_variance), dtype=np.float64)
        initial = []
        for name in names:
            rows = [i for i, c in enumerate(channel_variables) if c == name]
            initial.append(float(np.log(max(float(variance[rows].mean()), 1e-12))))
        self.log_variance = nn.Parameter(torch.tensor(initial, dtype=torch.float32))
        for name in names:
            given = variable_weights.get(name, 1.0)
            if not isinstance(given, (int, float)):
                raise ValueError(f"trainer.loss.variable_weights.{name}: {given}; with "
                                 "trainer.loss.learnable_variance a variable has one weight")
        index = [names.index(c) for c in channel_variables]
        counts = {v: channel_variables.count(v) for v in names}
        # m_v x (C / V) / count_v: one mean over every channel is then the mean over variables
        scale = [float(variable_weights.get(c, 1.0)) * len(channel_variables) / len(names) / counts[c]
                 for c in channel_variables]
        self.register_buffer("channel_index", torch.tensor(index), persistent=False)
        self.register_buffer("channel_scale", torch.tensor(scale, dtype=torch.float64).float(), persistent=False)
        self.optimizer: torch.optim.Optimizer | None = None

    def channel_weights(self) -> torch.Tensor:
        """(C,) m_v exp(-s_v) (C / V) / count_v of each channel's variable."""
        return self.channel_scale * torch.exp(-self.log_variance)[self.channel_index]

    def penalty(self) -> torch.Tensor:
        """0.5 mean_v s_v: what keeps the s_v from growing without bound."""
        return 0.5 * self.log_variance.mean()

    def frozen(self) -> "LearnedVariance":
        """A copy at these values that no gradient reaches (validation's weights)."""
        copy = LearnedVariance.__new__(LearnedVariance)
        nn.Module.__init__(copy)
        copy.variables = list(self.variables)
        copy.log_variance = nn.Parameter(self.log_variance.detach().clone(), requires_grad=False)
        copy.register_buffer("channel_index", self.channel_index.clone(), persistent=False)
        copy.register_buffer("channel_scale", self.channel_scale.clone(), persistent=False)
        copy.optimizer = None
        return copy

    # ------------------------------------------------------------------ training
    def attach_optimizer(self, lr: float, betas: Sequence[float], eps: float, weight_decay: float) -> None:
        """Their AdamW, at the constant rate `lr` (see the module docstring)."""
        self.optimizer = torch.optim.AdamW([self.log_variance], lr=lr, betas=tuple(betas), eps=eps,
                                           weight_decay=weight_decay, foreach=False)

    def zero_grad(self) -> None:
        self.log_variance.grad = None

    def step(self) -> None:
        """Average the gradient over every rank (each holds the same s_v; tensor-parallel peers
        the same gradient), then take the AdamW step."""
        grad = self.log_variance.grad
        if grad is None:
            return
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            total = grad.to(torch.float64)
            dist.all_reduce(total)
            grad.copy_(total / dist.get_world_size())
        assert self.optimizer is not None, "attach_optimizer before step"
        self.optimizer.step()

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """s_v and their AdamW moments and step count: plain tensors, the same on every rank."""
        state = {"log_variance": self.log_variance.detach()}
        adam = self.optimizer.state.get(self.log_variance, {}) if self.optimizer is not None else {}
        for key in ("exp_avg", "exp_avg_sq", "step"):
            state[key] = (adam[key] if key in adam else
                          torch.zeros_like(self.log_variance) if key != "step" else torch.tensor(0.0))
        return state

    def restore(self, state: Mapping[str, torch.Tensor]) -> None:
        """Put back what `checkpoint_state` gave (loaded into its tensors, or read afresh)."""
        with torch.no_grad():
            self.log_variance.copy_(state["log_variance"])
        if self.optimizer is not None and float(state["step"]) > 0:
            self.optimizer.state[self.log_variance] = {
                "step": torch.tensor(float(state["step"])),
                "exp_avg": state["exp_avg"].clone(), "exp_avg_sq": state["exp_avg_sq"].clone()}

    def columns(self) -> dict[str, float]:
        """metrics.csv's log_variance_<variable> columns: each s_v now."""
        return {f"log_variance_{n}": float(s) for n, s in zip(self.variables, self.log_variance.detach())}
