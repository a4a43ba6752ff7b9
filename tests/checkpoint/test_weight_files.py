"""Single-file checkpoints of the windowformer: strict loading, resume from the file,
convert-checkpoint. (CREDIT's files: tests/models/test_credit_models.py and
tests/parallel/test_credit_resume.py.)

Real torch.save files of a real model, real hydra composition, real DCP directories.
"""

import logging
import os
from pathlib import Path

import pytest
from launches import credit_command
import torch

import credit
from omegaconf import OmegaConf

from credit.checkpoint import CheckpointError
from credit.checkpoint.weights import convert_checkpoint, load_weights_file, load_weights_only_checkpoint
from credit.data import model_layout
from credit.checkpoint.manager import checkpoint_keys
from credit.cli import main as credit_main
from credit.config import compose_config
from credit.models import build_model
from credit.train.metrics import read_metrics
from credit.parallel import build_runtime
from credit.train.trainer import Trainer

@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_data):
    """A windowformer for the tiny config, saved the way a training script saves one."""
    from tiny import tiny_overrides

    root = tmp_path_factory.mktemp("weights")
    cfg = compose_config(tiny_overrides(tiny_data, f"run_dir={root / 'unused'}"))
    layout = model_layout(cfg.data)
    torch.manual_seed(1)
    state = build_model(cfg.model, **layout).state_dict()
    path = root / "weights.pt"
    torch.save({"model_state_dict": state, "epoch": 7, "optimizer_state_dict": {"state": {}}}, path)
    return {"path": path, "state": state, "cfg": cfg, "layout": layout, "root": root}


def _model(saved):
    return build_model(saved["cfg"].model, **saved["layout"])


def _assert_holds(model, saved):
    expected = saved["state"]
    loaded = model.state_dict()
    assert loaded.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(loaded[key], tensor), key


def test_loading_a_file_sets_every_weight(saved, tmp_path):
    model = _model(saved)
    load_weights_file(model, saved["path"])
    _assert_holds(model, saved)
    # a bare state dict saved from a DistributedDataParallel wrapper loads the same
    bare = tmp_path / "bare.pt"
    torch.save({f"module.{k}": v for k, v in saved["state"].items()}, bare)
    model = _model(saved)
    load_weights_file(model, bare)
    _assert_holds(model, saved)


def _save_edited(tmp_path, saved, edit):
    state = dict(saved["state"])
    edit(state)
    path = tmp_path / "edited.pt"
    torch.save({"model_state_dict": state}, path)
    return path


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda s: s.pop("stages.1.layers.0.3.down.bias"), r"missing keys \['stages\.1\.layers\.0\.3\.down\.bias'\]"),
        (lambda s: s.update({"head.extra": torch.ones(2)}), r"unexpected keys \['head\.extra'\]"),
        (lambda s: s.update({"head.bias": torch.ones(3)}), r"wrong shapes \['head\.bias \(3,\) \(model: \(\d+,\)\)'\]"),
    ],
    ids=["missing", "unexpected", "shape"],
)
def test_strict_load_names_every_bad_key_and_changes_nothing(saved, tmp_path, edit, named):
    path = _save_edited(tmp_path, saved, edit)
    model = _model(saved)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=named) as info:
        load_weights_file(model, path)
    assert "\n" not in str(info.value)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_file_without_a_state_dict_is_an_error_naming_it(saved, tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"epoch": 3, "notes": "no weights"}, path)
    with pytest.raises(CheckpointError, match=r"other\.pt holds neither"):
        load_weights_file(_model(saved), path)


def _trainer(overrides):
    cfg = compose_config(overrides)
    trainer = Trainer(cfg, build_runtime(cfg))
    trainer.setup()
    return trainer


def test_resume_from_a_file_loads_weights_only_and_trains(saved, tiny_overrides, tmp_path, caplog):
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="credit.train.trainer"):
        trainer = _trainer(tiny_overrides(run, f"trainer.resume={saved['path']}", "trainer.max_steps=2",
                                          "trainer.ema.enabled=true", "trainer.ema.decay=0.9"))
    assert "loaded model weights only" in caplog.text and "start fresh at step 0" in caplog.text
    assert trainer.step == 0
    _assert_holds(trainer.model, saved)
    for name, param in trainer.model.named_parameters():
        assert torch.equal(trainer.ema.shadow[name], param), name  # EMA starts from the loaded weights
    assert not trainer.optimizer.state  # fresh optimizer
    trainer.fit()
    assert [int(r["step"]) for r in read_metrics(run / "metrics.csv")] == [1, 2]


def _cli(*args):
    src = str(Path(credit.__file__).resolve().parents[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    return credit_command(*args, env=env, timeout=180)


def test_convert_checkpoint_then_train_continues(saved, tiny_overrides, tmp_path, capsys):
    from tiny import TINY_MODEL

    out = tmp_path / "converted"
    data = [o for o in tiny_overrides(tmp_path) if o.startswith("data.")]
    result = _cli("convert-checkpoint", str(saved["path"]), str(out), *TINY_MODEL, *data)
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}" in result.stdout
    keys = checkpoint_keys(out)
    assert "config" in keys and "source" in keys and not any(k.startswith("optim.") for k in keys)
    assert {k[len("model."):] for k in keys if k.startswith("model.")} == set(saved["state"])
    model = _model(saved)
    load_weights_only_checkpoint(model, out)
    _assert_holds(model, saved)

    # a second conversion to the same place is refused before anything is written
    listing = sorted(p.name for p in out.iterdir())
    assert credit_main(["convert-checkpoint", str(saved["path"]), str(out), *TINY_MODEL]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out} already exists; refusing to overwrite" in err
    assert sorted(p.name for p in out.iterdir()) == listing
    assert not list(tmp_path.glob(".partial_*"))

    run = tmp_path / "run"
    assert credit_main(["train", *tiny_overrides(run, f"trainer.resume={out}", "trainer.max_steps=2")]) == 0
    assert f"loaded model weights only from {out}" in capsys.readouterr().out
    assert [int(r["step"]) for r in read_metrics(run / "metrics.csv")] == [1, 2]
    assert (run / "checkpoints" / "step_00000002" / ".metadata").is_file()


def test_a_converted_checkpoint_for_another_model_is_refused(saved, tmp_path):
    out = tmp_path / "converted"
    convert_checkpoint(saved["path"], out, saved["cfg"])
    with pytest.raises(FileExistsError, match="already exists"):
        convert_checkpoint(saved["path"], out, saved["cfg"])
    spectral = {**OmegaConf.to_container(saved["cfg"].model), "use_spectral_norm": True}
    other = build_model(spectral, **saved["layout"])
    # the spectral-norm model's weights have the same names; its u, v of every projection and
    # conv are missing: counted, the first ten named, nothing unexpected
    with pytest.raises(CheckpointError,
                       match=r"\(strict load\): \d+ missing keys \[.*'embeds\.0\.convs\.0\.weight_u'.*more\]$"):
        load_weights_only_checkpoint(other, out)
