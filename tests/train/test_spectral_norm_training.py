"""The default experiment with spectral norm on: one process (tp1) vs torchrun dp2 x tp2,
judged by manual_tests/gen2_parallelism/check_parity.py, and the dp2 x tp2 checkpoint
resumed in one process (u, v as stored; training continues on the tp2 losses)."""

import os

import pytest
import torch
from tiny import tiny_overrides
from launches import credit_command
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from credit.config import compose_config
from credit.models import has_spectral_norm
from credit.parallel import build_runtime
from credit.train.metrics import read_metrics
from credit.train.trainer import Trainer
from manual_scripts import run_script

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
SN = ["model.use_spectral_norm=true"]


@pytest.fixture(scope="module")
def runs(tiny_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("sn_parity")
    base = tiny_overrides(tiny_data, *SN, "trainer.max_steps=10", "trainer.batch_size=2",
                          "trainer.checkpoint.every_n_steps=5", "data.valid_samples=4")
    serial = credit_command("train", "--nproc", "1", *base, "trainer.batch_size=4", f"run_dir={root / 'serial'}",
                            env=ENV)
    assert serial.returncode == 0, serial.stdout[-3000:] + serial.stderr[-3000:]
    tp2 = credit_command("train", "--nproc", "4", *base, "parallelism=fsdp2_tp2", "trainer.resume=never",
                         f"run_dir={root / 'tp2'}", env=ENV)
    assert tp2.returncode == 0, tp2.stdout[-3000:] + tp2.stderr[-3000:]
    return {"root": root, "base": base, "tp2": tp2}


def test_tp1_and_tp2_losses_match_with_spectral_norm_on(runs):
    root = runs["root"]
    result = run_script("check_parity", root / "serial", root / "tp2", "--rtol", "1e-5")
    assert result.returncode == 0, result.stdout
    assert result.stdout.startswith("PASS: 10 steps match")
    log = runs["tp2"].stdout + runs["tp2"].stderr
    assert "applied tensor parallel (tp=2) to 8 blocks" in log  # every spectral-normed block shards
    assert "replicated" not in log


def test_a_dp2_tp2_checkpoint_resumes_in_one_process_with_u_v_as_stored(runs, tmp_path):
    root = runs["root"]
    saved = root / "tp2" / "checkpoints" / "step_00000005"
    dcp_to_torch_save(saved, tmp_path / "saved.pt")
    stored = torch.load(tmp_path / "saved.pt", weights_only=False)["model"]

    cfg = compose_config([*runs["base"], "trainer.batch_size=4", f"trainer.resume={saved}",
                          f"run_dir={tmp_path / 'resumed'}"])
    trainer = Trainer(cfg, build_runtime(cfg))
    trainer.setup()
    assert trainer.step == 5
    checked = 0
    for name, module in trainer.model.named_modules():
        if has_spectral_norm(module):
            for vector in ("weight_u", "weight_v"):
                assert torch.equal(getattr(module, vector), stored[f"{name}.{vector}"]), name
                checked += 1
    assert checked >= 2 * 12
    trainer.fit()
    resumed = {int(r["step"]): float(r["loss"]) for r in read_metrics(tmp_path / "resumed" / "metrics.csv")
               if r["split"] == "train"}
    straight = {int(r["step"]): float(r["loss"]) for r in read_metrics(root / "tp2" / "metrics.csv")
                if r["split"] == "train"}
    assert sorted(resumed) == [6, 7, 8, 9, 10]
    for step, loss in resumed.items():
        assert loss == pytest.approx(straight[step], rel=1e-5), step
