"""Config composition with real hydra: strict keys, validation, one-line CLI errors."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from imported import imported_and_printed

from credit.config import ConfigError, compose_config

REPO = Path(__file__).resolve().parents[2]
CREDIT = [sys.executable, "-m", "credit.cli"]


def test_default_config_composes_with_every_group():
    cfg = compose_config([])
    assert cfg.model.name == "nextgen_wxformer"
    assert cfg.data.root == "data/embedded"
    assert cfg.trainer.parallelism.data == "none" and cfg.trainer.parallelism.tensor == 1
    assert "hydra" not in cfg
    for key in ("run_dir", "trainer.max_steps", "trainer.seed", "trainer.resume",
                "trainer.checkpoint.every_n_steps", "trainer.checkpoint.keep_latest_k",
                "data.root"):
        node = cfg
        for part in key.split("."):
            node = node[part]


def test_overrides_apply():
    cfg = compose_config(["trainer.max_steps=50", "run_dir=/tmp/x", "model.dim=[64,128,256,512]"])
    assert cfg.trainer.max_steps == 50 and cfg.run_dir == "/tmp/x"
    assert list(cfg.model.dim) == [64, 128, 256, 512]


@pytest.mark.parametrize(
    "override, named",
    [
        ("trainer.max_stepz=5", "max_stepz"),
        ("+model.dropout=0.1", "dropout"),
        ("+data.files.extra=x.nc", "extra"),
        ("trainer.max_steps=abc", "trainer.max_steps"),
        ("trainer.max_steps=0", "trainer.max_steps=0"),
        ("trainer.batch_size=-2", "trainer.batch_size=-2"),
        ("model.dim_head=7", "model.dim_head=7"),
        ("model.depth=[1,1]", "model.depth"),
        ("model.cross_embed_kernel_sizes=[[1],[2,4],[2,4],[2,4]]", "model.cross_embed_kernel_sizes[0]"),
        ("model.attn_dropout=1.5", "model.attn_dropout=1.5"),
        ("model=wxformer model.padding_conf.mode=zeros", "model.padding_conf.mode"),
        ("model=windowformer model.padding=zeros", "model.padding='zeros'"),
        ("model.gemm=exact", "model.gemm='exact'"),
        ("model.spectral_norm_tp=gather", "model.spectral_norm_tp='gather'"),
        ("trainer.resume=/no/such/checkpoint", "trainer.resume='/no/such/checkpoint'"),
        ("trainer.parallelism.data=horovod", "trainer.parallelism.data='horovod'"),
        ("trainer.parallelism.tensor=0", "trainer.parallelism.tensor=0"),
        ("trainer.parallelism.tensor=3", "trainer.parallelism.tensor=3"),  # 4 heads in stage 0
        ("trainer.parallelism.mixed_precision=fp8", "trainer.parallelism.mixed_precision='fp8'"),
        ("trainer.parallelism.sequence_parallel=true", "sequence_parallel=True is invalid: needs trainer.parallelism.tensor > 1"),
        ("model=windowformer trainer.parallelism.tensor=2 trainer.parallelism.sequence_parallel=true",
         "model.name in ['crossformer', 'wxformer', 'nextgen_wxformer', 'crossformer-ensemble'], got 'windowformer'"),
        ("trainer.ema.decay=1.0", "trainer.ema.decay=1.0"),
        ("trainer.optimizer.betas=[0.9,1.2]", "trainer.optimizer.betas"),
        ("data.train_period=[2001-01-01,2000-01-01]", "data.train_period"),
        ("data.valid_period=[2000-14-01,2001-01-01]", "data.valid_period='2000-14-01'"),
        ("data.history_len=0", "data.history_len=0"),
        ("+trainer.loss.variable_weights.XYZ=2", "XYZ"),
        ("model=nope", "model/nope'; available: crossformer, crossformer-ensemble, nextgen_wxformer, windowformer, wxformer"),
    ],
)
def test_bad_config_is_one_error_naming_the_key(override, named):
    with pytest.raises(ConfigError) as info:
        compose_config(override.split())
    message = str(info.value)
    assert named in message
    assert "\n" not in message


def test_deterministic_mode_refuses_only_a_tensor_degree_it_cannot_reproduce():
    # widths that do not split into whole GEMM leaves are kept whole on every tp rank
    # (tests/train/test_deterministic_training.py runs them bitwise); the tree splits in halves
    for tensor in (2, 4):
        assert compose_config(["model.gemm=deterministic", f"trainer.parallelism.tensor={tensor}"])
    with pytest.raises(ConfigError) as info:
        compose_config(["model.gemm=deterministic", "model=wxformer", "model.dim=[96,192,384,768]",
                        "model.dim_head=32", "trainer.parallelism.tensor=3"])
    assert "power of two" in str(info.value) and "\n" not in str(info.value)


def _run(args, **kwargs):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, **kwargs)


@pytest.mark.parametrize("command", [["-m", "credit.cli", "check"], ["-m", "credit.cli", "train"],
                                     [str(REPO / "applications" / "train.py")]])
def test_cli_typo_fails_fast_with_one_line(command, tmp_path):
    # fast: refused before torch is imported, the seconds of any command's start-up (a
    # property of the code path, not of the machine's speed)
    result = _run([sys.executable, "-X", "importtime", *command, "trainer.max_stepz=5", f"run_dir={tmp_path}/run"])
    assert result.returncode == 2
    modules, lines = imported_and_printed(result.stderr)
    assert len(lines) == 1 and "max_stepz" in lines[0], result.stderr[-3000:]
    assert "omegaconf" in modules and "torch" not in modules, sorted(modules)
    assert not (tmp_path / "run").exists()


def test_check_prints_the_resolved_config():
    result = _run([*CREDIT, "check", "trainer.max_steps=7"])
    assert result.returncode == 0, result.stderr
    assert "max_steps: 7" in result.stdout


def test_configs_ship_inside_a_non_editable_install(tmp_path):
    """Build the wheel, install it alone into a folder, compose from outside the repo."""
    wheel_dir = tmp_path / "wheel"
    build = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "-q", str(REPO), "-w", str(wheel_dir)])
    assert build.returncode == 0, build.stderr
    wheel = next(wheel_dir.glob("credit-*.whl"))
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    assert (target / "credit" / "conf" / "data" / "era5.yaml").is_file()
    probe = ("import credit, sys; from credit.config import compose_config; "
             "c = compose_config(['trainer.max_steps=3']); "
             "assert credit.__file__.startswith(sys.argv[1]), credit.__file__; "
             "print(c.model.name, c.trainer.max_steps)")
    # the wheel's folder first; a PYTHONPATH already set (dependencies installed with --target) after it
    env_path = os.pathsep.join([str(target), *filter(None, [os.environ.get("PYTHONPATH")])])
    result = subprocess.run([sys.executable, "-c", probe, str(target)], capture_output=True,
                            text=True, cwd=tmp_path, timeout=120,
                            env={**os.environ, "PYTHONPATH": env_path, "PYTHONSAFEPATH": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["nextgen_wxformer", "3"]


def test_yaml_groups_never_restate_a_schema_default():
    """One source of defaults: a group file holds only what it changes (schema.py has the rest)."""
    from pathlib import Path

    import yaml
    from omegaconf import OmegaConf

    from credit.config.schema import Config

    conf = Path(__file__).resolve().parents[2] / "credit" / "conf"
    defaults = OmegaConf.to_container(OmegaConf.structured(Config))
    restated = []
    checked = 0
    for path in sorted(conf.glob("*/*.yaml")):
        text = path.read_text()
        package = path.parent.name
        first = text.splitlines()[0] if text else ""
        if first.startswith("# @package "):
            package = first[len("# @package "):].strip()
        node = defaults
        for part in package.split("."):
            node = node[part]

        def walk(values, base, where):
            nonlocal checked
            for key, value in (values or {}).items():
                assert key in base, f"{path}: {where}{key} is not a schema key"
                if isinstance(value, dict):
                    walk(value, base[key], f"{where}{key}.")
                else:
                    checked += 1
                    if value == base[key]:
                        restated.append(f"{path.relative_to(conf)}: {where}{key}={value!r}")

        walk(yaml.safe_load(text), node, f"{package}.")
    assert checked >= 8  # era5 and the parallelism layouts do change things
    assert not restated, restated


@pytest.mark.parametrize("command", ["train", "rollout", "check", "convert-checkpoint"])
def test_help_after_a_command_prints_usage(command, capsys):
    from credit.cli import main

    assert main([command, "--help"]) == 0
    out = capsys.readouterr()
    assert "train [--nproc N] [--credit-config CREDIT.yml] [KEY=VALUE ...]" in out.out and not out.err


def test_a_launched_rank_runs_its_launchers_config_without_composing(monkeypatch):
    """`credit train --nproc N`: the launcher composes and checks the config once; each rank
    is handed that config (`credit.cli._rank_main`) and never composes the overrides again."""
    from credit import cli

    launched = compose_config(["trainer.max_steps=7"])
    monkeypatch.setattr(cli, "_LAUNCHED_CONFIG", launched)
    # overrides that would not compose: a rank never reads them
    code, cfg = cli._compose_or_launch(["no_such_key=1", "--nproc", "4"], "train")
    assert code is None and cfg is launched
    monkeypatch.setattr(cli, "_LAUNCHED_CONFIG", None)
    code, cfg = cli._compose_or_launch(["no_such_key=1"], "train")
    assert code == 2 and cfg is None
