"""Plain-tensor clipping against torch, and parallel-layout errors (no process group)."""

import os
import subprocess
import sys

import pytest
import torch
from imported import imported_and_printed

from credit.parallel import clip_grad_norm_, resolve_layout, total_grad_norm


def _params(seed: int, scale: float):
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in [(7, 3), (5,), (4, 4, 2)]]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * scale
    return params


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
@pytest.mark.parametrize("scale", [0.01, 10.0])  # clipping inactive / active
def test_plain_tensors_bit_identical_to_torch(norm_type, scale):
    ours, theirs = _params(0, scale), _params(0, scale)
    a = clip_grad_norm_(ours, 1.0, norm_type)
    b = torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type)
    assert torch.equal(a, b)
    for p, q in zip(ours, theirs):
        assert torch.equal(p.grad, q.grad)


def test_it_really_clips_and_handles_no_grads():
    params = _params(1, 10.0)
    before = total_grad_norm([p.grad for p in params])
    returned = clip_grad_norm_(params, 0.5)
    assert torch.equal(returned, before) and before > 0.5
    assert total_grad_norm([p.grad for p in params]).item() == pytest.approx(0.5, rel=1e-5)
    assert clip_grad_norm_([torch.nn.Parameter(torch.ones(2))], 1.0).item() == 0.0


@pytest.mark.parametrize(
    "world, data, tensor, named",
    [
        (4, "fsdp2", 3, "trainer.parallelism.tensor=3 does not divide the world size 4"),
        (4, "none", 2, "trainer.parallelism.data='none'"),
    ],
)
def test_bad_layouts_name_the_key(world, data, tensor, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        resolve_layout(world, data, tensor)


def test_good_layouts():
    layout = resolve_layout(4, "fsdp2", 2)
    assert (layout.dp, layout.tp) == (2, 2)
    assert (resolve_layout(2, "none", 2).dp, resolve_layout(4, "ddp", 1).dp) == (1, 4)


def test_cli_rejects_an_indivisible_layout_before_launching(tmp_path):
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "credit.cli", "train", "--nproc", "4", "parallelism=fsdp2_tp2",
         "trainer.parallelism.tensor=3", f"run_dir={tmp_path}/run"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 2
    modules, lines = imported_and_printed(result.stderr)
    assert len(lines) == 1 and "trainer.parallelism.tensor=3" in lines[0], result.stderr[-3000:]
    # before launching: nothing imported torch's launcher API, which only `credit.launch.launch`
    # imports. (torch itself may be listed: the forkserver, started at once so its imports
    # overlap composing the config, prints its import times into the same stderr.)
    assert "omegaconf" in modules and "torch.distributed.launcher.api" not in modules, sorted(modules)
    assert not (tmp_path / "run").exists()
