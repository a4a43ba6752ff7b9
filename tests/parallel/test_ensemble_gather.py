"""Members spread over the ranks of an ensemble group (`credit.train.ensemble.MembersGathered`,
`trainer.parallelism.ensemble`): CREDIT's ring CRPS (`loss.training_loss: ring-crps`, one
member per data-parallel rank) gives each rank its member's gradient of the fair CRPS; the
gathered members' almost-fair CRPS at alpha 1 gives the same gradients on the same ranks
(fixture tests/fixtures/credit_losses/ring_crps.pt, made with CREDIT's RingCRPSLoss on 2 and
4 gloo ranks), and every rank of the group the same loss."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from launcher import run_ranks

FIXTURE = Path(__file__).parent.parent / "fixtures" / "credit_losses" / "ring_crps.pt"


def _member_gradient(members: torch.Tensor, target: torch.Tensor) -> tuple[float, torch.Tensor]:
    from credit.train.ensemble import MembersGathered
    from credit.train.losses import WeightedLoss

    loss_fn = WeightedLoss(torch.ones(target.shape[-2]), torch.ones(target.shape[1]), "almost_fair_crps")
    mine = members[dist.get_rank()].clone().requires_grad_(True)  # (B, C, H, W): one member of each sample
    loss = MembersGathered(loss_fn, dist.group.WORLD)(mine, target)
    loss.backward()
    return float(loss), mine.grad


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_gathered_crps_gives_each_rank_credits_ring_crps_gradient(ranks):
    fixture = torch.load(FIXTURE)[ranks]
    results = run_ranks(_member_gradient, ranks, fixture["members"], fixture["target"])
    for rank, (loss, grad) in enumerate(results):
        assert loss == results[0][0]  # one loss, the same bits on every rank of the group
        # sums of +-1 / (K (K - 1) N) terms: a few roundings of the gradient's magnitude
        torch.testing.assert_close(grad, fixture["rank_grad"][rank], rtol=1e-5, atol=1e-9)
    # the fair CRPS itself: its value from the members in one process
    members = fixture["members"]
    one = members.movedim(0, 1).reshape(-1, *members.shape[2:])  # member-minor rows
    from credit.train.ensemble import almost_fair_crps

    assert results[0][0] == pytest.approx(float(almost_fair_crps(one, fixture["target"], 1.0).mean()), rel=1e-6)
