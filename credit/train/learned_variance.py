"""Learned variable weights (`trainer.loss.learnable_variance`, CREDIT's BaseLoss
`var_weighting: learnable`): Kendall and Gal's uncertainty weighting, one log-variance s_v
per output variable, trained beside the model.

    L = mean_v( m_v exp(-s_v) L_v + 0.5 s_v )

L_v is the variable's mean error (latitude-weighted, over its levels and grid), m_v its
`trainer.loss.variable_weights` entry (default 1). s_v starts at log(max(var_v, 1e-12)), the
variance of the values the loss scores: in physical space the data's target statistics (the
mean over its channels of std², as `inverse_variance` reads it, so the first step weighs as
`inverse_variance` does), on normalized values 1 (s_v = 0).

What CREDIT's trainer does and this module keeps: the s_v take their own AdamW step with the
model's betas, eps and weight decay at the constant `trainer.optimizer.lr` (CREDIT adds them
to its optimizer after the scheduler is built, which then leaves their group's rate alone);
gradient clipping and the EMA see the model's parameters only; validation scores with the
weights of the first step (CREDIT's validation criterion is a second, untrained instance).
Where this differs, on purpose: the s_v gradient is averaged over every rank, the one-process
gradient at the global batch (CREDIT's ranks each step their own copy, which drift apart),
and the s_v and their AdamW moments are checkpointed (CREDIT re-initialises them on resume).

Deterministic mode keeps its promise here too: the per-sample sums go variable by variable
(each by the fixed K tree, then a fixed tree over variables), and the s_v gradient is not
autograd's broadcast sum, whose grouping of the batch's rows follows the per-rank batch, but
one fixed tree over every rank's rows in global sample order (`deterministic_gradient`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from credit.kernels.gemm._tree import tree_sum
from credit.parallel.mesh import replica_mesh
from credit.train.deterministic import row_sums


class _VariableSums(torch.autograd.Function):
    """(B,) sum over variables of w_v S_{b,v} by the fixed tree over v. Backward: S's gradient
    g_b w_v (one product an element); w's rows g_b S_{b,v} are handed to `learned`, which adds
    them over every rank's samples by one tree in global order at the step (no layout then
    changes how the batch's rows are grouped)."""

    @staticmethod
    def forward(ctx, sums, weights, learned):  # type: ignore[override]
        ctx.save_for_backward(sums, weights)
        ctx.learned = learned
        return tree_sum(list((sums * weights).unbind(1)))

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        sums, weights = ctx.saved_tensors
        ctx.learned.weight_rows.append(grad[:, None] * sums)
        return grad[:, None] * weights, None, None


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
        self.weight_rows: list[torch.Tensor] = []  # deterministic mode: (B, V) per loss call, by backward

    def channel_weights(self) -> torch.Tensor:
        """(C,) m_v exp(-s_v) (C / V) / count_v of each channel's variable."""
        return self.channel_scale * torch.exp(-self.log_variance)[self.channel_index]

    def penalty(self) -> torch.Tensor:
        """0.5 mean_v s_v: what keeps the s_v from growing without bound."""
        return 0.5 * self.log_variance.mean()

    def sample_sums(self, scaled: torch.Tensor) -> torch.Tensor:
        """Deterministic mode: (B,) per-sample sums of `scaled` (B, C, ...: the error weighted by
        latitude and `channel_scale`) times exp(-s_v): each variable's channels summed by the
        fixed K tree, then the variables by the fixed tree; the s_v gradient is made at the
        step (`deterministic_gradient`), so neither follows the layout."""
        per_variable = [row_sums(scaled.index_select(1, rows)) for rows in self._variable_rows(scaled.device)]
        return _VariableSums.apply(torch.stack(per_variable, dim=1), torch.exp(-self.log_variance).detach(), self)

    def _variable_rows(self, device: torch.device) -> list[torch.Tensor]:
        index = self.channel_index.tolist()
        return [torch.tensor([c for c, v in enumerate(index) if v == n], device=device)
                for n in range(len(self.variables))]

    def frozen(self) -> "LearnedVariance":
        """A copy at these values that no gradient reaches (validation's weights)."""
        copy = LearnedVariance.__new__(LearnedVariance)
        nn.Module.__init__(copy)
        copy.variables = list(self.variables)
        copy.log_variance = nn.Parameter(self.log_variance.detach().clone(), requires_grad=False)
        copy.register_buffer("channel_index", self.channel_index.clone(), persistent=False)
        copy.register_buffer("channel_scale", self.channel_scale.clone(), persistent=False)
        copy.optimizer = None
        copy.weight_rows = []
        return copy

    # ------------------------------------------------------------------ training
    def attach_optimizer(self, lr: float, betas: Sequence[float], eps: float, weight_decay: float) -> None:
        """Their AdamW, at the constant rate `lr` (see the module docstring)."""
        self.optimizer = torch.optim.AdamW([self.log_variance], lr=lr, betas=tuple(betas), eps=eps,
                                           weight_decay=weight_decay, foreach=False)

    def zero_grad(self) -> None:
        self.log_variance.grad = None
        self.weight_rows = []

    def step(self, mesh: DeviceMesh | None = None, deterministic: bool = False, penalty_terms: int = 0) -> None:
        """Combine the ranks' gradients, then take the AdamW step. Fast mode: autograd's
        gradient, averaged over every rank (each holds the same s_v; tensor-parallel peers the
        same gradient). Deterministic mode: `deterministic_gradient` over `mesh`'s replicas
        (the data-parallel ranks) with the penalty's `penalty_terms`."""
        if deterministic:
            replicas = replica_mesh(mesh).get_group() if mesh is not None else None
            self.log_variance.grad = self.deterministic_gradient(replicas, penalty_terms)
        elif (self.log_variance.grad is not None and dist.is_available() and dist.is_initialized()
              and dist.get_world_size() > 1):
            total = self.log_variance.grad.to(torch.float64)
            dist.all_reduce(total)
            self.log_variance.grad.copy_(total / dist.get_world_size())
        if self.log_variance.grad is None:
            return
        assert self.optimizer is not None, "attach_optimizer before step"
        self.optimizer.step()

    def deterministic_gradient(self, replicas: dist.ProcessGroup | None, penalty_terms: int) -> torch.Tensor | None:
        """d loss / d s_v: the rows g_b S_{b,v} of every loss call on every replica, in the order
        (call, replica, sample), which is the global sample order of each call, added by one
        tree; times d exp(-s_v) / d s_v; plus the penalty's gradient."""
        if not self.weight_rows:
            return None
        local = torch.stack(self.weight_rows)  # (calls, B, V)
        if replicas is not None and dist.get_world_size(replicas) > 1:
            parts = [torch.empty_like(local) for _ in range(dist.get_world_size(replicas))]
            dist.all_gather(parts, local.contiguous(), group=replicas)
            local = torch.stack(parts, dim=1)  # (calls, replicas, B, V)
        rows = local.reshape(-1, local.shape[-1])
        weights = torch.exp(-self.log_variance.detach())
        grad = -(tree_sum(list(rows.unbind(0))) * weights)
        return grad + torch.full_like(grad, penalty_terms * 0.5 / len(self.variables))

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
