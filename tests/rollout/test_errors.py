"""Every refusal of `credit rollout` is one line naming the key, file or time at fault,
and leaves existing forecasts untouched."""

import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp

from credit.checkpoint.manager import CheckpointManager, load_checkpoint
from credit.cli import main

SPAN = "span 2000-01-01T00:00 to 2000-01-12T18:00, 2001-01-01T00:00 to 2001-01-12T18:00 every 6 h"


def refuse(capsys, overrides) -> str:
    """Run `credit rollout`; it must fail with status 2 and one line on stderr."""
    capsys.readouterr()
    assert main(["rollout", *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


@pytest.mark.parametrize("extra, expected", [
    (["rollout.checkpoint=/no/such/checkpoint"], "rollout.checkpoint=/no/such/checkpoint does not exist"),
    (["model.dim=[16,16]", "model.depth=[2,1]"],
     "model config differs from checkpoint"),
    (["data.levels=[500]"], "data.levels: run [500.0], checkpoint [500.0, 850.0]"),
    (["rollout.init_times=[2002-03-01T00]"], "rollout init time 2002-03-01T00:00 is outside the data: "
                                             "the data under"),
    (["rollout.init_times=[2001-01-12T12]", "rollout.lead_steps=3"],
     "rollout init time 2001-01-12T12:00 needs data up to 2001-01-13T06:00 (lead_steps=3)"),
    (["rollout.weights=best"], "rollout.weights='best' is invalid: allowed: ['auto', 'ema', 'model']"),
    (["rollout.lead_steps=0"], "rollout.lead_steps=0 is invalid: must be >= 1"),
    (["rollout.init_range.start=2001-01-03", "rollout.init_range.end=2001-01-02"],
     "rollout.init_range.end='2001-01-02' is invalid: must not be before rollout.init_range.start"),
    (["rollout.init_times=[2001-01-02T00,2001-01-02T00]"], "lists 2001-01-02T00:00 more than once"),
    (["rollout.map_channel=T_300"], "rollout.map_channel='T_300' is not an output channel"),
    (["rollout.lead_step=3"], "Key 'lead_step' not in 'RolloutConfig'"),
])
def test_one_line_errors(trained_run, tmp_path, capsys, extra, expected):
    _, overrides = trained_run
    err = refuse(capsys, overrides(f"rollout.output_dir={tmp_path}", *extra))
    assert expected in err
    if "outside the data" in expected or "needs data" in expected:
        assert SPAN in err
    if "model config differs" in expected:
        assert "model.dim: run [16, 16], checkpoint [16, 32]" in err and "model.depth" in err
    assert not any(tmp_path.iterdir())  # refused before writing anything


def test_auto_without_checkpoints_and_an_incomplete_checkpoint(trained_run, tmp_path, capsys):
    _, overrides = trained_run
    err = refuse(capsys, overrides(f"run_dir={tmp_path / 'fresh'}"))
    assert f"rollout.checkpoint=auto found no complete checkpoint in {tmp_path / 'fresh' / 'checkpoints'}" in err
    (tmp_path / "half").mkdir()
    err = refuse(capsys, overrides(f"rollout.checkpoint={tmp_path / 'half'}"))
    assert "is not a complete DCP checkpoint directory: no .metadata" in err


def test_loading_is_strict_and_names_the_keys(trained_run, tmp_path, capsys):
    run_dir, overrides = trained_run
    source = run_dir / "checkpoints" / "step_00000040"
    # A real DCP checkpoint with the same config whose weights lack one key and hold another.
    stored = dcp.FileSystemReader(str(source)).read_metadata().state_dict_metadata
    state = {"model": {k[len("model."):]: torch.empty(md.size) for k, md in stored.items()
                       if k.startswith("model.")}, "config": ""}
    load_checkpoint(source, state)
    state["model"]["extra.weight"] = state["model"].pop("head.weight")
    CheckpointManager(tmp_path, keep_latest_k=1).save(1, state)
    edited = tmp_path / "step_00000001"
    err = refuse(capsys, overrides(f"rollout.checkpoint={edited}",
                                   f"rollout.output_dir={tmp_path / 'out'}"))
    assert "does not fit the model (strict load): 1 missing keys ['head.weight']; 1 unexpected keys ['extra.weight']" in err
    err = refuse(capsys, overrides(f"rollout.checkpoint={edited}", "rollout.weights=ema",
                                   f"rollout.output_dir={tmp_path / 'out'}"))
    assert "rollout.weights=ema but checkpoint" in err and "holds no EMA weights" in err


def test_existing_forecasts_are_never_overwritten_silently(trained_run, tmp_path, capsys):
    _, overrides = trained_run
    args = overrides("rollout.init_times=[2001-01-04T00]", "rollout.lead_steps=1",
                     f"rollout.output_dir={tmp_path}", "rollout.skill=false")
    assert main(["rollout", *args]) == 0
    target = tmp_path / "forecast_2001-01-04T00.nc"
    before = target.read_bytes()
    target.write_bytes(b"keep me")
    err = refuse(capsys, args)
    assert f"{target} exists" in err and "rollout.overwrite=true" in err
    assert target.read_bytes() == b"keep me"
    assert main(["rollout", *args, "rollout.overwrite=true"]) == 0
    assert len(target.read_bytes()) == len(before)
    shutil.rmtree(tmp_path)


def test_model_config_comparison_names_keys_and_skips_sections_a_checkpoint_lacks(trained_run):
    from omegaconf import OmegaConf

    from credit.config import compose_config
    from credit.checkpoint.config_check import model_config_differences

    _, overrides = trained_run
    run = compose_config(overrides())
    stored = OmegaConf.create({"model": {**OmegaConf.to_container(run.model), "ff_mult": 2}})
    assert model_config_differences(run, stored) == ["model.ff_mult: run 4, checkpoint 2"]
    stored.data = {"history_len": 2}
    assert model_config_differences(run, stored)[-1] == "data.history_len: run 1, checkpoint 2"
