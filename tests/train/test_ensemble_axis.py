"""An ensemble's members spread over ranks (`trainer.parallelism.ensemble`, the mesh's "ens"
axis between dp and tp): the keys' rules, the global row each member's randomness is keyed
on, and `credit train` in deterministic mode giving one process's bits with members split
over ranks, beside tensor and sequence parallelism, beside data parallelism, and killed and
resumed in one process; in fast mode, the same losses and gradient norms within rounding.

CREDIT's noise-injecting CrossFormer with dropout 0.1 and four members a sample, its KCRPS.
"""

import os
import subprocess
import sys
import time

import pytest
import torch
from test_deterministic_training import _same_bits
from tiny import tiny_data_overrides
from launches import credit_command
from processes import kill_last_rank

from credit.config import ConfigError, compose_config
from credit.models.dropout import DropoutStep, MemberBlock, global_rows
from credit.parallel.mesh import resolve_layout
from credit.train.metrics import read_metrics

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
MODEL = ["model=crossformer-ensemble", "model.noise_latent_dim=8", "model.dim=[8,16,32,64]", "model.dim_head=4",
         "model.local_window_size=[2,2,2,1]", "model.global_window_size=[2,2,1,1]",
         "model.padding_conf.activate=true", "model.padding_conf.pad_lat=[8,8]", "model.padding_conf.pad_lon=[0,0]",
         "model.attn_dropout=0.1", "model.ff_dropout=0.1", "trainer.max_steps=4", "trainer.valid_every_n_steps=2",
         "trainer.checkpoint.every_n_steps=2", "data.valid_samples=4", "trainer.ema.enabled=true",
         "trainer.ensemble_size=4", "trainer.loss.function=kcrps", "trainer.parallelism.data=fsdp2",
         "model.freeze=false"]  # every weight trains: every weight gradient's tree is compared
DETERMINISTIC = [*MODEL, "model.gemm=deterministic"]


@pytest.mark.parametrize("overrides, named", [
    (["trainer.parallelism.ensemble=3", "trainer.ensemble_size=4", "trainer.loss.function=kcrps",
      "trainer.parallelism.data=fsdp2"], "trainer.parallelism.ensemble=3"),
    (["trainer.parallelism.ensemble=2", "trainer.ensemble_size=4", "trainer.loss.function=kcrps"],
     "trainer.parallelism.ensemble=2"),  # data=none: nothing adds the member blocks' gradients
    (["trainer.parallelism.ensemble=2", "trainer.ensemble_size=4", "trainer.loss.function=kcrps",
      "trainer.parallelism.data=fsdp2", "model.gemm=deterministic", "trainer.batch_size=2"], "trainer.batch_size=2"),
    (["trainer.parallelism.ensemble=0"], "trainer.parallelism.ensemble=0"),
    (["trainer.parallelism.ensemble=2", "trainer.parallelism.data=fsdp2"], "needs trainer.ensemble_size > 1"),
])
def test_a_bad_ensemble_axis_is_one_error_naming_the_key(overrides, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        compose_config(overrides)


def test_the_layout_divides_the_world_by_ensemble_and_tensor():
    layout = resolve_layout(8, "fsdp2", 2, 2)
    assert (layout.dp, layout.ens, layout.tp) == (2, 2, 2)
    with pytest.raises(ConfigError, match="trainer.parallelism.ensemble=2"):
        resolve_layout(6, "fsdp2", 2, 2)


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_member_blocks_rows_are_one_processs_rows_of_those_members(ranks):
    """Three samples from global sample 5, four members each, feature maps of 6 rows a member:
    the rows a rank of the ensemble axis keys its dropout and noise on are exactly the rows
    one process holding every member keys on for those members."""
    samples, members, per = 3, 4, 6
    whole = global_rows(DropoutStep(0, 0, 5 * members, samples * members), samples * members * per, "cpu")
    whole = whole.view(samples, members, per)
    here = members // ranks
    for rank in range(ranks):
        block = MemberBlock(members, here, rank * here)
        rows = global_rows(DropoutStep(0, 0, 5 * members, samples * here, block), samples * here * per, "cpu")
        assert torch.equal(rows, whole[:, rank * here:(rank + 1) * here].reshape(-1))


def _train(tiny_data, run, nproc, *overrides):
    result = credit_command("train", "--nproc", nproc, *tiny_data_overrides(tiny_data, *overrides, f"run_dir={run}"),
                            env=ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


# four ranks on two cores each launch: the module's runs take a few minutes
pytestmark = pytest.mark.timeout(900)


def test_members_over_ranks_beside_tensor_and_sequence_parallelism_are_one_processs_bits(tiny_data, tmp_path):
    """One member block of each sample per ens rank, its rows split over tp ranks too."""
    _train(tiny_data, tmp_path / "one", 1, *DETERMINISTIC, "trainer.batch_size=1")
    spread = _train(tiny_data, tmp_path / "ens2_tp2_sp", 4, *DETERMINISTIC, "trainer.batch_size=1",
                    "trainer.parallelism.ensemble=2", "trainer.parallelism.tensor=2",
                    "trainer.parallelism.sequence_parallel=true")
    assert "spread over 2 ranks" in spread.stdout + spread.stderr
    _same_bits(tmp_path / "one", tmp_path / "ens2_tp2_sp")


def test_members_over_ranks_beside_data_parallelism_killed_and_resumed_in_one_process_keep_its_bits(
        tiny_data, tmp_path):
    """dp2 x ens2 (one sample and two members a rank), one rank SIGKILLed after step 3 (between
    the checkpoints of steps 2 and 4), then resumed from step 2 by one process holding both
    samples' members: one process's bits throughout."""
    _train(tiny_data, tmp_path / "one", 1, *DETERMINISTIC, "trainer.batch_size=2")
    run = tmp_path / "dp2_ens2_killed"
    launch = [sys.executable, "-m", "credit.cli", "train", "--nproc", "4",
              *tiny_data_overrides(tiny_data, *DETERMINISTIC, "trainer.batch_size=1", "trainer.parallelism.ensemble=2",
                                   f"run_dir={run}")]
    # lowest priority for the ranks: on a loaded machine this watcher still kills in time
    agent = subprocess.Popen(launch, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             preexec_fn=lambda: os.nice(19))
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and agent.poll() is None:
        metrics = run / "metrics.csv"
        if metrics.exists() and sum(",train," in line for line in metrics.read_text().splitlines()) >= 3:
            assert kill_last_rank(agent.pid) == 3
            break
        time.sleep(0.02)
    assert agent.wait(timeout=120) != 0, "the run finished before the kill after step 3"
    _train(tiny_data, run, 1, *DETERMINISTIC, "trainer.batch_size=2", "trainer.resume=auto")
    _same_bits(tmp_path / "one", run)


def test_members_over_ranks_in_fast_mode_train_as_one_process_within_rounding(tiny_data, tmp_path):
    """The fast reduction averages over dp x ens; each ens rank holds its members' share of
    the gradient, so the loss is seeded ens times larger: with dropout off (members differ by
    their indexed noise only) the losses and gradient norms are one process's within
    rounding, where a missing factor would halve every gradient norm."""
    fast = [*MODEL, "model.attn_dropout=0", "model.ff_dropout=0", "trainer.batch_size=1", "trainer.max_steps=3",
            "trainer.valid_every_n_steps=3", "trainer.checkpoint.every_n_steps=0"]
    _train(tiny_data, tmp_path / "one", 1, *fast)
    _train(tiny_data, tmp_path / "ens2", 2, *fast, "trainer.parallelism.ensemble=2", "trainer.parallelism.data=ddp")
    one, spread = (read_metrics(tmp_path / name / "metrics.csv") for name in ("one", "ens2"))
    assert len(one) == len(spread) == 3
    for a, b in zip(one, spread):
        assert float(b["loss"]) == pytest.approx(float(a["loss"]), rel=1e-5)
        assert float(b["grad_norm"]) == pytest.approx(float(a["grad_norm"]), rel=1e-4)
