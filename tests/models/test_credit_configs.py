"""Every config file in CREDIT's repository whose model is one of CREDIT's three classes
reads here as CREDIT reads it.

tests/fixtures/credit_configs/configs.json holds each file's `model:` section as YAML loads
it and the parameter count CREDIT's own `load_model` gave (see that folder's README). For
each: `credit check --credit-config` names CREDIT's class and the same count, built on the
meta device; the keys CREDIT ignores are named as ignored; every section gives the model
overrides that `credit convert-checkpoint` and `credit plan` compose and validate, an active
`post_conf` as this project's `model.post_conf` with the same fixers on.
"""

import json
import os
from pathlib import Path

import pytest
from launches import credit_command
import yaml

from credit.interop.checkpoint_import import describe_credit_model
from credit.config import compose_config

INVENTORY = json.loads((Path(__file__).parent.parent / "fixtures" / "credit_configs" / "configs.json").read_text())
CONFIGS = {entry["path"]: entry for entry in INVENTORY["configs"]}


def _post_blocks_on(section: dict) -> bool:
    return bool((section.get("post_conf") or {}).get("activate", False))


def test_the_inventory_covers_both_crossformers():
    kinds = {entry["type"] for entry in CONFIGS.values()}
    assert {"crossformer", "wxformer"} <= kinds and len(CONFIGS) >= 20


@pytest.mark.parametrize("path", sorted(CONFIGS))
def test_credit_config_reads_as_credit_reads_it(path, tmp_path):
    entry = CONFIGS[path]
    file = tmp_path / "credit.yml"
    file.write_text(yaml.safe_dump({"model": entry["model"]}))
    lines, refused, overrides = describe_credit_model(file)
    assert f"CREDIT's {entry['credit_class']}," in lines[1]
    assert lines[2].startswith(f"parameters: {entry['parameters']:,} as CREDIT counts them"), lines[2]
    for key in ("frame_patch_size", "decoder_attention_type", "static_channels"):
        if key in entry["model"]:
            assert f"model.{key}: ignored, as CREDIT ignores it" in lines
    assert refused == []
    cfg = compose_config(overrides)  # what convert-checkpoint and plan compose
    assert cfg.model.name == ("wxformer" if entry["type"] == "wxformer_base" else entry["type"])
    post_conf = entry["model"].get("post_conf") or {}
    if _post_blocks_on(entry["model"]):
        on = {name for name in ("tracer_fixer", "global_mass_fixer", "global_water_fixer", "global_energy_fixer")
              if (post_conf.get(name) or {}).get("activate")}
        assert cfg.model.post_conf.activate
        assert {name for name in on if cfg.model.post_conf[name].activate} == on
        for name in on:
            for key, value in post_conf[name].items():
                if key in ("tracer_thres", "tracer_thres_max"):  # CREDIT's parser applies float()
                    value = [float(v) for v in value]
                if key in cfg.model.post_conf[name]:
                    assert cfg.model.post_conf[name][key] == value, (name, key)
        assert "post blocks: " + ", ".join(sorted(on)) + " (CREDIT's post_conf, as model.post_conf)" in lines
    elif "post_conf" in cfg.model:
        assert not cfg.model.post_conf.activate


def test_credit_check_command_prints_the_class_count_and_config(tmp_path):
    entry = CONFIGS["config/gen_2/smoke/smoke_gen2_casper.yml"]
    file = tmp_path / "credit.yml"
    file.write_text(yaml.safe_dump({"model": entry["model"]}))
    result = credit_command("check", "--credit-config", file, "trainer.max_steps=3",
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "credit.models.crossformer.CrossFormer, built here as model=crossformer" in result.stdout
    assert f"parameters: {entry['parameters']:,}" in result.stdout
    assert "max_steps: 3" in result.stdout and "name: crossformer" in result.stdout


def test_credit_check_refuses_a_post_block_credit_runs_and_credit_does_not_in_one_line(tmp_path):
    path = next(p for p, e in sorted(CONFIGS.items()) if _post_blocks_on(e["model"]))
    section = CONFIGS[path]["model"]
    section = {**section, "post_conf": {**section["post_conf"], "skebs": {"activate": True}}}
    file = tmp_path / "credit.yml"
    file.write_text(yaml.safe_dump({"model": section}))
    result = credit_command("check", "--credit-config", file, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "model.post_conf.skebs is active" in errors[0], result.stderr


def test_the_docs_table_lists_every_config_with_its_count():
    page = (Path(__file__).parents[2] / "docs" / "credit_models.md").read_text()
    for path, entry in CONFIGS.items():
        row = next((line for line in page.splitlines() if line.startswith(f"| `{path}` |")), None)
        assert row is not None, path
        assert f"| {entry['parameters']:,} |" in row, row
        assert "refused" not in row, row


def test_a_gen2_config_with_post_blocks_says_how_credits_gen2_programs_differ(tmp_path):
    entry = CONFIGS["config/gen_2/examples/wxformer_era5_025deg_6hr.yml"]
    file = tmp_path / "credit.yml"
    file.write_text(yaml.safe_dump({"model": entry["model"], "data": {"source": {"ERA5": {}}}}))
    lines, refused, overrides = describe_credit_model(file)
    assert refused == [] and "model.post_conf.tracer_fixer.activate=true" in overrides
    assert any(line.startswith("note: this is a gen2 config: CREDIT's train_gen2.py ignores model.post_conf")
               for line in lines)
    file.write_text(yaml.safe_dump({"model": entry["model"]}))  # no data section: nothing to say
    assert not any(line.startswith("note:") for line in describe_credit_model(file)[0])
