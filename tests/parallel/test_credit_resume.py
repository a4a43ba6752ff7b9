"""A converted CREDIT checkpoint resumes at dp2 x tp2 (FSDP2 over tensor-parallel groups),
still forecasts what CREDIT forecasts there, trains, and rolls out.

The checkpoint is CREDIT's conv-format nextgen_wxformer with spectral norm (fused q/k/v split,
σ kept), on a generated dataset of the fixture's channel layout (4 upper-air variables at
4 levels, 2 surface, 3 input-only, 32x64)."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from launcher import run_ranks
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor, Shard

from credit.interop.checkpoint_import import OVERRIDES_FILE, convert_credit_checkpoint
from credit.cli import main as credit_main
from credit.config import compose_config
from credit.data import generate_dataset
from credit.models.credit.checkpoint import read_credit_state_dict
from credit.models.credit.remap import remap_conv_state_dict
from credit.parallel import build_runtime
from credit.train.metrics import read_metrics
from credit.train.trainer import Trainer

FIXTURE = Path(__file__).parent.parent / "fixtures" / "credit_reference" / "wxformer_next_conv_sn"
Q = "layers.0.1.layers.0.0.to_q.weight"


@pytest.fixture(scope="module")
def credit_layout_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("credit_layout_era5")
    generate_dataset(root, grid=(32, 64), years=[2000, 2001], levels=[300, 500, 700, 850], train_years=[2000],
                     days_per_year=4, progress=False, overwrite=True)
    return root


def _full(tensor):
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().cpu().clone()


def resume_check_and_train(overrides):
    cfg = compose_config(overrides)
    trainer = Trainer(cfg, build_runtime(cfg))
    trainer.setup()
    q = dict(trainer.model.named_parameters())[Q]
    sharded = isinstance(q, DTensor) and Shard(0) in q.placements
    trainer.model.eval()
    with torch.no_grad():
        out = trainer.model(torch.load(FIXTURE / "input.pt"))
    credit = torch.load(FIXTURE / "output.pt")
    difference = ((out - credit).abs().max() / credit.abs().max()).item()
    trainer.model.train()
    weights = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    weights = {k: _full(v) for k, v in weights.items()} if dist.get_rank() == 0 else None
    step = trainer.step
    trainer.fit()
    return {"step": step, "sharded": sharded, "difference": difference, "weights": weights}


def test_converted_credit_checkpoint_resumes_at_dp2_tp2_and_rolls_out(credit_layout_data, tmp_path):
    out = tmp_path / "converted"
    model_overrides = convert_credit_checkpoint(FIXTURE / "model.yml", FIXTURE / "checkpoint.pt", out)
    assert (out / OVERRIDES_FILE).read_text().split() == model_overrides
    data = [f"data.root={credit_layout_data}", "data.generate_if_missing=false",
            "data.train_period=[2000-01-01,2000-01-04]", "data.valid_period=[2001-01-01,2001-01-04]",
            "data.valid_samples=4", "trainer.batch_size=1", "trainer.progress_bar=false", "trainer.max_steps=2"]
    run_dir = tmp_path / "run"
    overrides = [*model_overrides, *data, "parallelism=fsdp2_tp2", f"run_dir={run_dir}", f"trainer.resume={out}"]
    per_rank = run_ranks(resume_check_and_train, 4, overrides)

    expected = remap_conv_state_dict(read_credit_state_dict(FIXTURE / "checkpoint.pt"))
    for result in per_rank:
        assert result["step"] == 0 and result["sharded"]  # weights only; q column-sharded over tp
        assert result["difference"] <= 1e-5  # CREDIT's forecast, under FSDP2 x TP
    weights = per_rank[0]["weights"]
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[k], expected[k]) for k in expected)
    rows = read_metrics(f"{run_dir}/metrics.csv")
    assert [int(r["step"]) for r in rows] == [1, 2] and all(float(r["loss"]) > 0 for r in rows)

    code = credit_main(["rollout", *model_overrides, *data[:-1], f"run_dir={run_dir}",
                        "rollout.init_range.start=2001-01-02", "rollout.init_range.end=2001-01-02",
                        "rollout.lead_steps=2"])
    assert code == 0
    assert sorted(p.suffix for p in (run_dir / "forecasts").glob("*.nc"))  # a CF netCDF forecast


def test_a_channel_layout_other_than_the_checkpoints_is_one_clear_error(credit_layout_data, tmp_path):
    out = tmp_path / "converted"
    model_overrides = convert_credit_checkpoint(FIXTURE / "model.yml", FIXTURE / "checkpoint.pt", out)
    code = credit_main(["train", *model_overrides, f"data.root={credit_layout_data}", "data.generate_if_missing=false",
                        "data.train_period=[2000-01-01,2000-01-04]", "data.valid_period=[2001-01-01,2001-01-04]",
                        "data.levels=[500,850]", f"run_dir={tmp_path / 'run'}", f"trainer.resume={out}"])
    assert code == 2
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_credit_checkpoint_file_resumes_directly(credit_layout_data, tmp_path):
    """`trainer.resume=checkpoint.pt` with the model overrides: CREDIT's file, remapped on load."""
    from credit.interop.checkpoint_import import model_overrides
    from credit.models.credit.checkpoint import read_credit_model_section
    from credit.models.credit.config import resolve_credit_model

    overrides = model_overrides(*resolve_credit_model(read_credit_model_section(FIXTURE / "model.yml")))
    run_dir = tmp_path / "run"
    code = credit_main(["train", *overrides, f"data.root={credit_layout_data}", "data.generate_if_missing=false",
                        "data.train_period=[2000-01-01,2000-01-04]", "data.valid_period=[2001-01-01,2001-01-04]",
                        "data.valid_samples=2", "trainer.batch_size=1", "trainer.max_steps=1",
                        "trainer.progress_bar=false", f"run_dir={run_dir}",
                        f"trainer.resume={FIXTURE / 'checkpoint.pt'}"])
    assert code == 0
    rows = read_metrics(f"{run_dir}/metrics.csv")
    assert [int(r["step"]) for r in rows] == [1] and float(rows[0]["loss"]) > 0
