"""`credit plan` as a user runs it: the table, the layouts that fit, its file, and one clear
error line for each bad input (nothing written)."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from launches import credit_command

from credit.cli import main
from credit.models.credit.checkpoint import read_credit_model_section
from credit.models.credit.config import count_parameters, resolve_credit_model

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# one block a stage: a trace's cost is per operation, and the table does not depend on depth
CROSSFORMER = ["model=wxformer", "model.padding_conf.activate=true", "model.padding_conf.pad_lat=[8,8]",
               "model.dim=[16,32,64,128]", "model.depth=[1,1,1,1]", "trainer.batch_size=1"]


def _plan(*args: str) -> subprocess.CompletedProcess:
    return credit_command("plan", "--no-progress", *args, env=ENV, cwd=REPO)


def test_plan_prints_every_layout_and_what_fits(tmp_path):
    out = tmp_path / "plan.md"
    result = _plan("--gpus", "1,2", "--grid", "16x32", "--gpu-memory", "0.05", "--out", str(out), *CROSSFORMER)
    assert result.returncode == 0, result.stderr
    table = result.stdout
    rows = [line for line in table.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    # one process; dp2 fsdp2 / ddp; tp2 with and without sequence parallelism, fsdp2 / ddp
    assert len(rows) == 7, table
    assert any("dp1×tp2+sp" in row for row in rows)
    assert "- 2 GPUs: fit:" in table or "- 2 GPUs: no layout fits." in table
    assert out.read_text() == table
    # the file is never overwritten
    again = _plan("--gpus", "1", "--grid", "16x32", "--out", str(out), *CROSSFORMER)
    assert again.returncode == 2 and "already exists" in again.stderr and out.read_text() == table


def test_plan_reads_the_model_of_a_credit_config():
    """CREDIT's older CrossFormer from a (scaled-down) CREDIT config: the plan names it with
    the parameter count CREDIT's own code gives, and traces it."""
    fixture = REPO / "tests" / "fixtures" / "credit_reference" / "crossformer_old_scse"
    result = _plan("--gpus", "1", "--credit-config", str(fixture / "model.yml"), "--global-batch", "1")
    assert result.returncode == 0, result.stderr
    # CREDIT's count also holds a cube_embedding its forward never calls, which ours leaves out
    credit_count, count = count_parameters(*resolve_credit_model(read_credit_model_section(fixture / "model.yml")))
    assert credit_count == json.loads((fixture / "meta.json").read_text())["parameters"]
    assert f"model: crossformer on a 29x56 grid, {count:,} parameters" in result.stdout, result.stdout
    row = next(line for line in result.stdout.splitlines() if line.startswith("| 1 "))
    params, optimizer = float(row.split("|")[5]), float(row.split("|")[7])
    assert params == round(count * 4 / 2**30, 3) and optimizer == round(2 * count * 4 / 2**30, 3), row


@pytest.mark.parametrize("args, message", [
    (["--gpus", "0"], "--gpus '0'"),
    (["--gpus", "2", *CROSSFORMER], "needs the grid"),
    (["--gpus", "2", "--grid", "16x32", "model.gemm=deterministic", *CROSSFORMER], "model.gemm=fast"),
    (["--gpus", "2", "--grid", "16x32", "trainer.nonsense=1"], "nonsense"),
    (["--credit-config", "missing.yml"], "missing.yml"),
    (["--usable", "1.5"], "(0, 1]"),
    (["--grid", "16x32", "--out", "no/such/folder/plan.md", *CROSSFORMER], "no/such/folder"),
    (["--grid", "30x64", "--gpus", "2"], "does not tile"),
])
def test_bad_input_is_one_error_line(args, message, capsys, monkeypatch):
    # in this process (a launch per case would cost seconds of imports each); the subprocess
    # case below checks that the command's own stderr holds that one line and nothing else
    monkeypatch.chdir(REPO)
    capsys.readouterr()
    assert main(["plan", "--no-progress", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], lines


def test_a_broken_credit_config_is_one_error_line(tmp_path):
    broken = tmp_path / "credit.yml"
    broken.write_text("model: [1,\n")  # YAML's own error spans several lines
    result = _plan("--credit-config", str(broken))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "cannot read the CREDIT config" in lines[0], result.stderr
