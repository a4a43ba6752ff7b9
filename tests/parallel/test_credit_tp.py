"""CREDIT's checkpoints forecast what CREDIT forecasts under tensor parallelism: the
fixtures of tests/models/test_credit_models.py at tp=2 on real gloo ranks (every fixture's
first stage has two heads, so tp=2 is the largest split they allow)."""

from pathlib import Path

import torch
from launcher import run_ranks

from credit.models.credit_checkpoint import from_credit

FIXTURES = Path(__file__).parent.parent / "fixtures" / "credit_reference"
NAMES = ["crossformer_earthpad_sn", "crossformer_frames2_diag", "wxformer_next_conv_sn", "wxformer_next_linear"]
TOLERANCE = 1e-5


def relative_difference(ours: torch.Tensor, credit: torch.Tensor) -> float:
    return ((ours - credit).abs().max() / credit.abs().max()).item()


def _tp_forward(names):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from credit.parallel import apply_native_tensor_parallel

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    results = {}
    for name in names:
        folder = FIXTURES / name
        model = from_credit(folder / "model.yml", folder / "checkpoint.pt")
        sharded = apply_native_tensor_parallel(model, mesh)
        with torch.no_grad():
            out = model(torch.load(folder / "input.pt"))
        results[name] = (sharded, relative_difference(out, torch.load(folder / "output.pt")))
    return results


def test_forward_matches_credit_at_tp2():
    for rank_result in run_ranks(_tp_forward, 2, NAMES):
        for name in NAMES:
            sharded, difference = rank_result[name]
            assert sharded > 0, name  # the attention and feed-forward blocks really are split
            assert difference <= TOLERANCE, (name, difference)


