"""Ensemble training on the batch axis (`trainer.ensemble_size` > 1): each sample's inputs
are repeated once per member, member-minor (CREDIT's `repeat_interleave`), so the members of
sample b are rows b x m .. b x m + m - 1 of the model's batch; they differ through the
model's randomness (dropout, keyed on the global row: the (sample, member) pair). The loss
scores the m forecasts of a sample against its one target by a CRPS over members.

The CRPS estimators are CREDIT's (`credit/losses/gen_1/kcrps.py`, `almost_fair_crps.py`),
elementwise, with the members last:
- `kcrps`: the fair kernel CRPS, mean_i |x_i - y| - sum_i (2i - m - 1) x_(i) / (m (m - 1))
  over the members sorted (x_(1) <= ... <= x_(m)): O(m log m);
- `almost_fair_crps`: mean_i |x_i - y| - (1 - (1 - alpha) / m) sum_{i != j} |x_i - x_j|
  / (2 m (m - 1)); alpha = 1 is the fair CRPS again, alpha < 1 leans toward the biased one
  (less spread rewarded).
Both need two members or more: with one, m (m - 1) = 0.

Members spread over ranks (`trainer.parallelism.ensemble` E > 1, the mesh's "ens" axis):
each rank of a sample's ensemble group forecasts m / E of its members, and `MembersGathered`
gathers the E blocks in rank order, so every rank of the group scores the same m forecasts
with the same arithmetic (the same bits) as one rank holding them all. The gather's backward
keeps a rank's own block of the loss gradient: the group's ranks then hold the gradients of
disjoint members, which the replicas' reduction over dp x ens adds.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from credit.train.deterministic import sample_sums

ENSEMBLE_FUNCTIONS = ("kcrps", "almost_fair_crps")
"""`trainer.loss.function` values that score an ensemble (their CRPS over members)."""

_BATCH_INPUTS = ("state", "forcing", "static")


def with_members(batch: dict[str, torch.Tensor], members: int) -> dict[str, torch.Tensor]:
    """`batch` with its inputs repeated `members` times per sample (member-minor); the
    targets stay one per sample."""
    if members == 1:
        return batch
    return {key: torch.repeat_interleave(value, members, dim=0) if key in _BATCH_INPUTS else value
            for key, value in batch.items()}


def _members_last(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B x m, ...) member-minor -> (B, ..., m)."""
    samples = target.shape[0]
    if prediction.shape[0] % samples:
        raise ValueError(f"{prediction.shape[0]} forecasts do not split into the members of {samples} samples")
    members = prediction.shape[0] // samples
    if members < 2:
        raise ValueError("a CRPS over members needs two members or more (trainer.ensemble_size)")
    return torch.movedim(prediction.reshape(samples, members, *target.shape[1:]), 1, -1)


def kernel_crps(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The fair kernel CRPS per element (B, ...) of the member-minor forecasts `prediction`
    (B x m, ...) against `target` (B, ...)."""
    members = _members_last(prediction, target)
    m = members.shape[-1]
    skill = (members - target.unsqueeze(-1)).abs().mean(-1)
    ordered = torch.sort(members, dim=-1).values
    rank = torch.arange(1, m + 1, dtype=members.dtype, device=members.device)
    return skill - ((2 * rank - m - 1) / (m * (m - 1)) * ordered).sum(-1)


def almost_fair_crps(prediction: torch.Tensor, target: torch.Tensor, alpha: float) -> torch.Tensor:
    """The almost-fair CRPS per element, with its `alpha` (1: fair)."""
    members = _members_last(prediction, target)
    m = members.shape[-1]
    skill = (members - target.unsqueeze(-1)).abs().mean(-1)
    pairs = (members.unsqueeze(-2) - members.unsqueeze(-1)).abs()  # the diagonal is |x_i - x_i| = 0
    spread = (1.0 / (2 * m * (m - 1))) * pairs.sum(dim=(-1, -2))
    return skill - (1 - (1 - alpha) / m) * spread


class _GatherMembers(torch.autograd.Function):
    """(B x m/E, ...) member blocks of E ranks -> (B x m, ...), member-minor, in rank order;
    backward: this rank's block of the gradient (every rank holds the same loss)."""

    @staticmethod
    def forward(ctx, local, samples, group):  # type: ignore[override]
        ranks, rank = dist.get_world_size(group), dist.get_rank(group)
        parts = [torch.empty_like(local) for _ in range(ranks)]
        dist.all_gather(parts, local.contiguous(), group=group)
        here = local.shape[0] // samples
        ctx.samples, ctx.here, ctx.rank = samples, here, rank
        blocks = [part.reshape(samples, here, *local.shape[1:]) for part in parts]
        return torch.cat(blocks, dim=1).reshape(samples * here * ranks, *local.shape[1:])

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        grouped = grad.reshape(ctx.samples, -1, *grad.shape[1:])
        own = grouped[:, ctx.rank * ctx.here:(ctx.rank + 1) * ctx.here]
        return own.reshape(ctx.samples * ctx.here, *grad.shape[1:]).contiguous(), None, None


def gather_members(local: torch.Tensor, samples: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Every member of `samples` samples from this rank's block `local` (B x m/E rows) and
    those of the other ranks of the ensemble group `group`, member-minor (B x m rows)."""
    if local.shape[0] % samples:
        raise ValueError(f"{local.shape[0]} forecasts do not split into the members of {samples} samples")
    return _GatherMembers.apply(local, samples, group)


class MembersGathered(nn.Module):
    """A CRPS loss (`credit.train.losses.WeightedLoss`) over members spread on the ranks of
    `group`: the members are gathered before it scores them (training; validation forecasts
    every member on every rank and uses the loss itself)."""

    def __init__(self, loss: nn.Module, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.loss, self.group = loss, group

    def weighted_error(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.loss.weighted_error(gather_members(prediction, target.shape[0], self.group), target)

    def sample_sums(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """(B,) per-sample sums by the fixed K tree (deterministic mode)."""
        return sample_sums(prediction, target, self.weighted_error)

    def elements(self, sample: torch.Tensor) -> int:
        return self.loss.elements(sample)

    def forward(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.weighted_error(prediction, target).mean()


def ensemble_error(function: str, prediction: torch.Tensor, target: torch.Tensor, alpha: float) -> torch.Tensor:
    """The elementwise CRPS `function` (one of `ENSEMBLE_FUNCTIONS`) per sample's element."""
    if function == "kcrps":
        return kernel_crps(prediction, target)
    if function == "almost_fair_crps":
        return almost_fair_crps(prediction, target, alpha)
    raise ValueError(f"ensemble loss {function!r}: one of {', '.join(ENSEMBLE_FUNCTIONS)}")
