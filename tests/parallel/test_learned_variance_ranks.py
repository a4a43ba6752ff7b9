"""The learned loss weights (`credit.train.learned_variance`) on several ranks: each rank's
gradient from its own samples, one AdamW step on their mean, the same values on every rank."""

import torch
from launcher import run_ranks

from credit.train.learned_variance import LearnedVariance

GRADIENTS = ([1.0, -2.0, 3.0], [-3.0, 1.0, -1.0])  # rank-local signs differ from their mean's


def _learned() -> LearnedVariance:
    learned = LearnedVariance(["T", "T", "Q", "SP"], {"Q": 2.0}, [4.0, 2.0, 1e-6, 1e4])
    learned.attach_optimizer(0.1, (0.9, 0.999), 1e-8, 0.01)
    return learned


def _one_step() -> list[float]:
    import torch.distributed as dist

    learned = _learned()
    learned.log_variance.grad = torch.tensor(GRADIENTS[dist.get_rank()])
    learned.step()
    return learned.log_variance.detach().tolist()


def test_ranks_take_one_step_on_their_mean_gradient():
    reference = _learned()
    mean = (torch.tensor(GRADIENTS[0], dtype=torch.float64) + torch.tensor(GRADIENTS[1], dtype=torch.float64)) / 2
    reference.log_variance.grad = mean.float()
    reference.step()
    ranks = run_ranks(_one_step, 2)
    assert ranks[0] == ranks[1] == reference.log_variance.detach().tolist()


def test_weights_start_at_the_inverse_variances():
    learned = _learned()
    assert learned.variables == ["T", "Q", "SP"]
    torch.testing.assert_close(learned.log_variance.detach(), torch.tensor([3.0, 1e-6, 1e4]).log())
    # m_v exp(-s_v) (C / V) / count_v: one mean over the channels is the mean over variables
    expected = torch.tensor([0.5 / 3, 0.5 / 3, 2e6, 1e-4]) * 4 / 3
    torch.testing.assert_close(learned.channel_weights().detach(), expected, rtol=1e-6, atol=0)
