"""The real trainer on (dp, tp) meshes: replica consistency, resume, resharding, crash safety."""

import os
import signal

import pytest
import torch
import torch.distributed as dist
from launcher import RankFailure, run_ranks
from tiny import tiny_overrides
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

from credit.checkpoint.manager import CheckpointManager, load_checkpoint
from credit.config import compose_config
from credit.parallel.collectives import _replicated_over_tp
from credit.train.metrics import read_metrics
from credit.parallel import build_runtime
from credit.train.trainer import Trainer


def _losses(run_dir):
    return [(r["step"], r["loss"]) for r in read_metrics(os.path.join(run_dir, "metrics.csv"))]


def _trainer(overrides):
    cfg = compose_config(overrides)
    trainer = Trainer(cfg, build_runtime(cfg))
    trainer.setup()
    return trainer


def _full_weights(trainer):
    """Full (unsharded) model and EMA tensors, on rank 0; collective on every rank."""
    model = get_model_state_dict(
        trainer.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    ema = {}
    if trainer.ema is not None:
        for name, t in trainer.ema.shadow.items():
            ema[name] = (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()
    if dist.is_initialized() and dist.get_rank() != 0:
        return {}, {}
    return {k: v.clone() for k, v in model.items()}, ema


def _replicas_identical(trainer):
    """Every tp-replicated parameter is bitwise equal across the tp group."""
    tp = trainer.runtime.mesh["tp"]
    checked = 0
    for param in trainer.model.parameters():
        if not _replicated_over_tp(param):
            continue
        local = (param.to_local() if isinstance(param, DTensor) else param).detach().contiguous()
        copies = [torch.empty_like(local) for _ in range(tp.size())]
        dist.all_gather(copies, local, group=tp.get_group())
        if not all(torch.equal(c, copies[0]) for c in copies):
            return False, checked
        checked += 1
    return True, checked


def train_straight_and_resumed(base, straight_dir, resumed_dir, steps):
    """A straight run and the same run split into two jobs, in one process group."""
    straight = _trainer([*base, f"run_dir={straight_dir}", f"trainer.max_steps={steps}"])
    straight.fit()
    identical, checked = _replicas_identical(straight)
    for _ in range(2):
        job = _trainer([*base, f"run_dir={resumed_dir}", f"trainer.max_steps={steps}",
                        f"trainer.steps_per_job={steps // 2}"])
        job.fit()
    return {"identical": identical, "checked": checked, "dp_rank": straight.runtime.dp_rank}


def load_and_continue(overrides, checkpoint_step):
    trainer = _trainer(overrides)
    loaded_step = trainer.step
    weights = _full_weights(trainer)
    trainer.fit()
    return {"loaded_step": loaded_step, "weights": weights, "world": dist.get_world_size()}


@pytest.fixture(scope="module")
def run_2x2(tmp_path_factory, tiny_data):
    """dp2 x tp2 FSDP2 with EMA: 6 steps straight, and 3 + resume 3 (past the 2-step warmup)."""
    root = tmp_path_factory.mktemp("run_2x2")
    base = _tiny(tiny_data) + [
        "parallelism=fsdp2_tp2", "trainer.ema.enabled=true", "trainer.ema.decay=0.9",
        "trainer.checkpoint.every_n_steps=3", "trainer.checkpoint.keep_latest_k=3",
    ]
    results = run_ranks(train_straight_and_resumed, 4, base, str(root / "straight"),
                        str(root / "resumed"), 6)
    return {"root": root, "results": results, "base": base}


def _tiny(data_root):
    # dropout on: a resume is bitwise only if the runtime randomness is restored too
    return tiny_overrides(data_root, "trainer.batch_size=2", "data.valid_samples=4",
                          "model.attn_dropout=0.1", "model.ff_dropout=0.1")


def test_replicated_parameters_stay_bitwise_identical_across_tp(run_2x2):
    for result in run_2x2["results"]:
        assert result["identical"]
        assert result["checked"] >= 10  # norms, convs, row-parallel biases, ...
    assert sorted(r["dp_rank"] for r in run_2x2["results"]) == [0, 0, 1, 1]


def test_fsdp2_tp_resume_continues_the_same_trajectory_bitwise(run_2x2):
    root = run_2x2["root"]
    straight, resumed = _losses(root / "straight"), _losses(root / "resumed")
    assert len(straight) == 6 and resumed == straight


@pytest.fixture(scope="module")
def single_from_step_3(run_2x2, tmp_path_factory):
    """One process resumed from the dp2 x tp2 run's step-3 checkpoint: its weights and EMA as
    loaded, then trained on to step 5 (the reference of both resharded layouts, made once)."""
    run = tmp_path_factory.mktemp("single") / "run"
    checkpoint = run_2x2["root"] / "straight" / "checkpoints" / "step_00000003"
    single = _trainer([*run_2x2["base"], "parallelism=single", f"run_dir={run}",
                       f"trainer.resume={checkpoint}", "trainer.max_steps=5"])
    loaded = {"step": single.step, "model": {k: v.clone() for k, v in single.model.state_dict().items()},
              "ema": {k: v.clone() for k, v in single.ema.shadow.items()}}
    single.fit()  # and training continues in one process too
    return {**loaded, "run": run}


@pytest.mark.parametrize(
    "world, layout",
    [(4, ["parallelism=fsdp2"]),  # dp4 x tp1
     (2, ["parallelism=single", "trainer.parallelism.tensor=2"])],  # dp1 x tp2, no data parallel
)
def test_a_dp2_tp2_checkpoint_reshards_bitwise_and_training_continues(run_2x2, single_from_step_3, tmp_path,
                                                                      world, layout):
    checkpoint = run_2x2["root"] / "straight" / "checkpoints" / "step_00000003"
    overrides = [*run_2x2["base"], *layout, f"run_dir={tmp_path / 'run'}",
                 f"trainer.resume={checkpoint}", "trainer.max_steps=5"]
    results = run_ranks(load_and_continue, world, overrides, 3)
    assert {r["loaded_step"] for r in results} == {3}
    model, ema = results[0]["weights"]

    single = single_from_step_3
    assert single["step"] == 3
    reference = single["model"]
    assert model.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(model[name], tensor), name
    for name, tensor in single["ema"].items():
        assert torch.equal(ema[name], tensor), name
    assert not torch.equal(ema["head.weight"], reference["head.weight"])  # EMA is its own state

    for run in (tmp_path / "run", single["run"]):
        rows = read_metrics(run / "metrics.csv")
        assert [int(r["step"]) for r in rows] == [4, 5]
        assert all(float(r["loss"]) > 0 for r in rows)


@pytest.mark.parametrize(
    "world, layout",
    [(4, ["parallelism=ddp", "trainer.parallelism.tensor=2", "trainer.ema.enabled=true"]),
     (2, ["parallelism=single", "trainer.parallelism.tensor=2"])],
)
def test_ddp_and_none_with_tp_resume_bitwise(tiny_data, tmp_path, world, layout):
    base = [*_tiny(tiny_data), *layout, "trainer.checkpoint.every_n_steps=2"]
    results = run_ranks(train_straight_and_resumed, world, base, str(tmp_path / "straight"),
                        str(tmp_path / "resumed"), 4)
    assert all(r["identical"] for r in results)
    straight, resumed = _losses(tmp_path / "straight"), _losses(tmp_path / "resumed")
    assert len(straight) == 4 and resumed == straight


class _KillThisRank:
    """Pickled while DCP writes: the rank dies half-way through the save."""

    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGKILL)
        return (int, (0,))


def save_then_die(root):
    rank = dist.get_rank()
    manager = CheckpointManager(root, keep_latest_k=2)
    manager.save(1, {"model": {"w": torch.full((8, 8), 1.0)}, "rank_data": {f"r{rank}": rank}})
    extra = {"killer": _KillThisRank()} if rank == 1 else {}
    manager.save(2, {"model": {"w": torch.full((8, 8), 2.0)}, "rank_data": {f"r{rank}": rank}, **extra})


def test_a_rank_killed_mid_save_leaves_the_previous_checkpoint_intact(tmp_path):
    root = tmp_path / "ckpt"
    with pytest.raises(RankFailure):
        run_ranks(save_then_die, 2, str(root), timeout=120)
    manager = CheckpointManager(root, keep_latest_k=2)
    assert manager.latest() == root / "step_00000001"
    assert not (root / "step_00000002").exists()
    state = {"model": {"w": torch.zeros(8, 8)}}
    load_checkpoint(manager.latest(), state)
    assert torch.equal(state["model"]["w"], torch.ones(8, 8))
