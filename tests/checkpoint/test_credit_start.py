"""Continuing a CREDIT training run (`trainer.load_weights` / `load_optimizer` / `reload_epoch`,
i.e. `trainer.credit_start`): CREDIT's own checkpoint.pt and the two steps its trainer took
after resuming (tests/fixtures/credit_gen1_checkpoint, written by CREDIT's code)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
from launches import credit_command
import torch
import yaml
from credit_fixtures import CHECKPOINT_RUN, credit_run_config

from credit.interop.training_state import parameter_order
from credit.interop.command_line import credit_file_overrides
from credit.config import ConfigError, compose_config
from credit.data.sampler import collate_samples
from credit.models.credit.checkpoint import from_credit, read_credit_checkpoint, unwrapped_name
from credit.models.credit.remap import remap_conv_state_dict
from credit.parallel import build_runtime
from credit.train.metrics import read_metrics
from credit.train.trainer import Trainer

RECORD = json.loads((CHECKPOINT_RUN / "record.json").read_text())
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _trainer(config: Path, *overrides: str) -> Trainer:
    args, _ = credit_file_overrides(["--credit-config", str(config), "trainer.device=cpu", "trainer.progress_bar=false",
                              *overrides])
    cfg = compose_config(args)
    trainer = Trainer(cfg, build_runtime(cfg))
    trainer.setup()
    return trainer


def _credit_moments(checkpoint: dict, moment: str) -> dict[str, torch.Tensor]:
    """CREDIT's AdamW state by parameter name (positions index `parameter_order.names`)."""
    state, names = checkpoint["optimizer_state_dict"]["state"], RECORD["parameter_order"]["names"]
    out = {}
    for position, name in enumerate(names):
        if position in state:
            out.update(remap_conv_state_dict({name: state[position][moment]}))
    return out


def _adam_step_ratio(beta1: float, beta2: float, step: int) -> float:
    """The largest |m^ / sqrt(v^)| of (bias-corrected) Adam at `step` over any gradients:
    (1-b1)/sqrt(1-b2) sqrt(sum_j (b1^2/b2)^j) sqrt(1-b2^t)/(1-b1^t), j < t (1.00 at step 4
    with CREDIT's betas 0.9, 0.95)."""
    history = sum((beta1 ** 2 / beta2) ** j for j in range(step))
    return (1 - beta1) / (1 - beta2) ** 0.5 * history ** 0.5 * (1 - beta2 ** step) ** 0.5 / (1 - beta1 ** step)


def test_the_optimizer_positions_follow_credits_parameter_order():
    """Spectral norm lists each layer's bias before its weight_orig, and a fused to_qkv is
    three parameters here: the positions still land on CREDIT's names."""
    fixture = CHECKPOINT_RUN / "spectral_norm"
    record = json.loads((fixture / "record.json").read_text())
    model = from_credit(yaml.safe_load((fixture / "credit.yml").read_text()), fixture / "checkpoint.pt")
    _, entries = read_credit_checkpoint(fixture / "checkpoint.pt")
    order = parameter_order(entries, {unwrapped_name(n) for n, _ in model.named_parameters()})
    assert [key for key, _ in order] == record["parameter_order"]["names"]
    assert any(len(names) == 3 for _, names in order)  # to_qkv -> to_q, to_k, to_v
    assert [names for key, names in order if key.startswith("cube_embedding.")] == [[]] * 4


def test_a_continued_run_takes_credits_next_two_steps(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    trainer = _trainer(credit_run_config(tmp_path))
    assert "continuing CREDIT's run" in caplog.text
    assert trainer.step == 2
    # the schedule where an uninterrupted run is (CREDIT's own resume runs this step at lr 0)
    assert trainer.scheduler.get_last_lr() == [pytest.approx(1e-3, rel=1e-12)]
    saved = torch.load(CHECKPOINT_RUN / "checkpoint.pt", weights_only=True)
    params = dict(trainer.model.named_parameters())
    for moment in ("exp_avg", "exp_avg_sq"):
        credit = _credit_moments(saved, moment)
        assert set(credit) == set(params)
        for name, value in credit.items():
            assert torch.equal(trainer.optimizer.state[params[name]][moment], value), name
    assert {float(s["step"]) for s in trainer.optimizer.state.values()} == {2.0}

    batches = torch.load(CHECKPOINT_RUN / "batches.pt", weights_only=True)
    lrs = []
    for k in (2, 3):
        samples = [int(i) for i in batches[f"step{k}_index"].flatten().tolist()]
        assert samples == RECORD["steps"][k]["sample_indices"]
        if k == 2:  # CREDIT's resumed first step ran at lr 0: take the same step to compare
            for group in trainer.optimizer.param_groups:
                group["lr"] = 0.0
        before = trainer.optimizer.param_groups[0]["lr"]
        lrs.append(before)
        result = trainer.train_step(iter([collate_samples([trainer.train_set[i] for i in samples])]))
        assert before == pytest.approx(RECORD["steps"][k]["lr"], rel=1e-12, abs=0)
        # measured spread: <= 2e-7 from CREDIT's across AVX2, scalar and MKL's CNR paths; 50x that
        assert result.loss == pytest.approx(RECORD["steps"][k]["loss"], rel=1e-5)
        assert result.grad_norm == pytest.approx(RECORD["steps"][k]["grad_norm_before_clip"], rel=1e-5)

    after = torch.load(CHECKPOINT_RUN / "checkpoint_epoch1.pt", weights_only=True)
    credit = remap_conv_state_dict({k: v for k, v in after["model_state_dict"].items()
                                    if not k.startswith("cube_embedding.")})
    ours = trainer.model.state_dict()
    assert set(ours) == set(credit)
    # fp32 forwards agree to ~1e-7 and most parameters to ~1e-8; Adam moves a parameter whose
    # gradient is rounding noise (a bias before a GroupNorm) by up to lr in a direction that the
    # CPU's rounding picks. Measured spread: 12-18 of 56,986 beyond 1e-6 across AVX2, scalar and
    # MKL's CNR paths; 0.1% (57) is 3x that
    differing = sum(int(((ours[k] - v).abs() > 1e-6).sum()) for k, v in credit.items())
    assert differing <= 1e-3 * sum(v.numel() for v in credit.values())
    # an error bound: opposite updates of the largest size Adam takes, 2 lr x max |m^ / sqrt(v^)|
    # a step (Cauchy-Schwarz over the moments' sums), 1.9e-3 here; measured 0.9-1.9e-4 on a
    # Zen 3's AVX2, scalar and MKL CNR paths, 3.1e-4 on an AVX-512 Xeon
    group = trainer.optimizer.param_groups[0]
    bound = sum(2 * lr * _adam_step_ratio(*group["betas"], int(step)) for lr, step in zip(lrs, (3, 4)))
    assert max(float((ours[k] - v).abs().max()) for k, v in credit.items()) <= bound


def test_weights_alone_start_at_step_zero_with_a_fresh_optimizer(tmp_path):
    config = credit_run_config(tmp_path, resume=False)
    conf = yaml.safe_load(config.read_text())
    conf["trainer"]["load_weights"] = True
    config.write_text(yaml.safe_dump(conf))
    trainer = _trainer(config)
    assert trainer.step == 0 and not trainer.optimizer.state
    saved = remap_conv_state_dict({k: v for k, v in
                                   torch.load(CHECKPOINT_RUN / "checkpoint.pt", weights_only=True)[
                                       "model_state_dict"].items() if not k.startswith("cube_embedding.")})
    assert all(torch.equal(v, saved[k]) for k, v in trainer.model.state_dict().items())


def test_the_flags_without_a_checkpoint_and_a_missing_file_are_one_error_each(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer.credit_start.optimizer=True is invalid: needs "
                                          r"trainer.credit_start.checkpoint"):
        compose_config(["trainer.credit_start.optimizer=true"])
    with pytest.raises(ConfigError, match=r"trainer.credit_start.checkpoint=.*nowhere.pt.* no such file"):
        compose_config([f"trainer.credit_start.checkpoint={tmp_path / 'nowhere.pt'}"])


FSDP_RUN = CHECKPOINT_RUN.parent / "credit_fsdp_checkpoint"


def _fsdp_config(tmp_path: Path, *files: str) -> Path:
    """The spectral-norm run's config in `trainer.mode: fsdp`, its save_loc holding `files` of
    tests/fixtures/credit_fsdp_checkpoint (the same state as FSDP1 saves it)."""
    config = credit_run_config(tmp_path, CHECKPOINT_RUN / "spectral_norm")
    conf = yaml.safe_load(config.read_text())
    conf["trainer"]["mode"] = "fsdp"
    config.write_text(yaml.safe_dump(conf))
    (tmp_path / "run" / "checkpoint.pt").unlink()
    for name in files:
        shutil.copy(FSDP_RUN / name, tmp_path / "run" / name)
    return config


def test_fsdp_modes_files_continue_the_run_as_its_checkpoint_pt_does(tmp_path):
    """CREDIT's `trainer.mode: fsdp` saves the weights (model_checkpoint.pt) and FSDP's full
    AdamW state, keyed by parameter name (optimizer_checkpoint.pt), beside a checkpoint.pt of
    epoch and schedule: the same run state as its single checkpoint.pt, bitwise."""
    fsdp = _trainer(_fsdp_config(tmp_path / "fsdp", "checkpoint.pt", "model_checkpoint.pt", "optimizer_checkpoint.pt"))
    single = _trainer(credit_run_config(tmp_path / "single", CHECKPOINT_RUN / "spectral_norm"))
    assert fsdp.cfg.trainer.credit_start.fsdp and fsdp.step == single.step == 2
    mine, theirs = dict(fsdp.model.named_parameters()), dict(single.model.named_parameters())
    assert all(torch.equal(v, theirs[k]) for k, v in mine.items())
    assert any(k.endswith("to_q.weight") for k in mine)  # the fused to_qkv's thirds, moments too
    for name, param in mine.items():
        ours, reference = fsdp.optimizer.state[param], single.optimizer.state[theirs[name]]
        assert set(ours) == set(reference) and all(torch.equal(ours[k], reference[k]) for k in ours), name
    assert fsdp.scheduler.get_last_lr() == single.scheduler.get_last_lr()


def test_fsdp_modes_missing_file_is_one_line(tmp_path):
    config = _fsdp_config(tmp_path, "checkpoint.pt", "model_checkpoint.pt")  # load_optimizer without its file
    args, _ = credit_file_overrides(["--credit-config", str(config)])
    with pytest.raises(ConfigError, match=r"trainer.credit_start.fsdp=True is invalid: CREDIT's fsdp mode writes "
                                          r"optimizer_checkpoint.pt beside checkpoint.pt"):
        compose_config(args)


def test_credit_train_continues_then_resumes_from_its_own_checkpoint(tmp_path):
    config = credit_run_config(tmp_path)
    common = ["train", "--credit-config", str(config), "trainer.progress_bar=false", "trainer.log_every_n_steps=1"]
    first = credit_command(*common, env=ENV, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "continuing CREDIT's run from" in first.stdout + first.stderr, first.stdout
    run = tmp_path / "run"
    steps = [int(row["step"]) for row in read_metrics(run / "metrics.csv")]
    assert steps == [3, 4]  # CREDIT's epochs: 2, at 2 batches each; it had taken 2 steps
    second = credit_command(*common, "trainer.max_steps=5", env=ENV, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    log = second.stdout + second.stderr
    assert "resumed from" in log and "continuing CREDIT's run" not in log, log
