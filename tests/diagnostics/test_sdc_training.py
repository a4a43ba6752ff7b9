"""The SDC detector inside real FSDP2 + TP training: `credit train --nproc 4` at dp2 x tp2
(gloo, real processes, real DCP checkpoints), and `credit sdc-probe` on 4 ranks.

- Every injection kind (a Linear's GEMM output, its FSDP2-gathered weight, its
  reduce-scattered gradient shard) is detected on the step it happens and localized to the
  layer, the path (compute / comm), the check and the rank, on ranks other than 0 too.
- warn trains on; stop exits 3 with one error line and saves nothing of the corrupted step;
  rollback reloads the last verified checkpoint, replays, and in deterministic mode ends
  with the bits of a run that was never corrupted.
- Clean runs verify over 1000 layers with zero mismatches, in fast and deterministic mode.
"""

import csv
import json
import os
from pathlib import Path

import pytest
from manual_scripts import run_script
from launches import credit_command

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
LAYOUT = ["trainer.parallelism.data=fsdp2", "trainer.parallelism.tensor=2"]
CHECKED = ["diagnostics.sdc.enabled=true", "trainer.valid_every_n_steps=0"]


def _credit(*args):
    return credit_command(*args, env=ENV)


def _rows(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv") as f:
        return [r for r in csv.DictReader(f) if r["split"] == "train"]


def _journal(run: Path) -> list[dict]:
    path = run / "sdc.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _clean(rows) -> int:
    """Layers verified over a run that found nothing."""
    assert all(r["layer_checksum_mismatches"] == "0" for r in rows)
    return sum(int(r["layers_verified"]) for r in rows)


def test_clean_fast_run_has_no_false_alarms(tiny_overrides, tmp_path):
    run = tmp_path / "fast"
    result = _credit("train", "--nproc", "4", *tiny_overrides(run), *LAYOUT, *CHECKED,
                     "trainer.max_steps=12", "diagnostics.sdc.every_n_steps=1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert ("sdc checks ON every 1 steps: comm (all_gather + reduce_scatter on 6 FSDP2 units); "
            "replica (70 parameters); compute (24 Linear layers" in result.stdout)
    rows = _rows(run)
    assert all(r["sdc_checks_run"] == "4" for r in rows)
    assert _clean(rows) >= 1000
    assert not (run / "sdc.jsonl").exists()


# (kind, layer, rank, action, the path and check that must name it)
INJECTIONS = [
    ("gemm_output", "stages.0.layers.0.0.to_q", 3, "stop", "compute", "compute"),
    ("all_gather", "stages.1.layers.0.1.up", 2, "warn", "comm", "all_gather"),
    ("grad_shard", "stages.0.layers.0.2.to_out", 1, "warn", "comm", "reduce_scatter"),
]


@pytest.mark.parametrize("kind,layer,rank,action,path,check", INJECTIONS, ids=[i[0] for i in INJECTIONS])
def test_injected_fault_is_caught_and_localized(tiny_overrides, tmp_path, kind, layer, rank, action,
                                                path, check):
    run = tmp_path / kind
    result = _credit("train", "--nproc", "4", *tiny_overrides(run), *LAYOUT, *CHECKED,
                     # stop: a checkpoint at 1, none of step 2; warn: checkpoints go on at 3 and 4
                     "trainer.max_steps=4", f"trainer.checkpoint.every_n_steps={1 if action == 'stop' else 3}",
                     "diagnostics.sdc.every_n_steps=2", f"diagnostics.sdc.action={action}",
                     f"diagnostics.sdc.inject.kind={kind}", f"diagnostics.sdc.inject.layer={layer}",
                     f"diagnostics.sdc.inject.rank={rank}", "diagnostics.sdc.inject.step=2")
    (record,) = _journal(run)
    assert (record["step"], record["rank"], record["layer"], record["path"], record["check"]) == \
        (2, rank, layer, path, check), record
    assert record["expected"] != record["got"]
    rows = _rows(run)
    assert [r["layer_checksum_mismatches"] for r in rows if r["step"] == "2"] == ["1"]
    assert all(r["layer_checksum_mismatches"] == "0" for r in rows if r["step"] != "2")
    assert int(rows[1]["layers_verified"]) > 0
    saved = sorted(p.name for p in (run / "checkpoints").iterdir())
    if action == "stop":
        assert result.returncode == 3, result.stderr[-3000:]
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "silent data corruption at step 2" in errors[0]
        assert [r["step"] for r in rows] == ["1", "2"]
        assert saved == ["step_00000001"]  # nothing of the corrupted step
    else:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "training on (diagnostics.sdc.action=warn)" in result.stdout
        assert rows[-1]["step"] == "4" and saved == ["step_00000003", "step_00000004"]
        assert rows[-1]["layers_verified"] != "0"  # checks go on after a warning


# two 64-wide stages: whole 32-wide GEMM leaves per rank at tp=2, the smallest such model
DETERMINISTIC = ["model.gemm=deterministic", "model.attn_dropout=0.1", "model.ff_dropout=0.1",
                 "model.dim=[64,64]", "model.dim_head=16", "trainer.batch_size=2",
                 "trainer.max_steps=8", "trainer.checkpoint.every_n_steps=2",
                 "diagnostics.sdc.every_n_steps=1"]


def test_rollback_ends_with_the_bits_of_a_clean_run(tiny_overrides, tmp_path):
    def train(run, *extra):
        result = _credit("train", "--nproc", "4", *tiny_overrides(run), *LAYOUT, *CHECKED,
                         *DETERMINISTIC, *extra)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result

    clean, rolled = tmp_path / "clean", tmp_path / "rolled"
    # the clean run saves only its end: the rolled run's checkpoints then change no bit either
    assert "compute (24 Linear layers, one row each, bitwise)" in train(clean, "trainer.checkpoint.every_n_steps=0").stdout
    assert _clean(_rows(clean)) >= 600  # deterministic mode: zero false alarms, bit for bit
    train(rolled, "diagnostics.sdc.action=rollback", "diagnostics.sdc.inject.kind=gemm_output",
          "diagnostics.sdc.inject.layer=stages.1.layers.0.3.up", "diagnostics.sdc.inject.rank=1",
          "diagnostics.sdc.inject.step=5")
    mismatch, rollback = _journal(rolled)
    assert (mismatch["step"], mismatch["rank"], mismatch["layer"], mismatch["path"]) == \
        (5, 1, "stages.1.layers.0.3.up", "compute")
    assert rollback["event"] == "rollback" and rollback["checkpoint"].endswith("step_00000004")
    rows = _rows(rolled)
    assert [r["step"] for r in rows] == [str(s) for s in range(1, 9)]  # replayed, nothing skipped
    assert [r["sdc_rollbacks"] for r in rows] == ["0"] * 4 + ["1"] * 4
    assert [r["loss"] for r in rows] == [r["loss"] for r in _rows(clean)]
    result = run_script("compare_runs", clean, rolled, "--state-only")
    assert result.returncode == 0 and "bitwise" in result.stdout, result.stdout + result.stderr


def test_sdc_probe_passes_clean_ranks_and_fails_a_corrupted_one(tmp_path):
    common = ["sdc-probe", "--nproc", "4", "--layers", "3", "--iterations", "2",
              "trainer.parallelism.tensor=2", f"run_dir={tmp_path / 'probe'}"]
    clean = _credit(*common)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]
    assert "PASS: 0 mismatch(es)" in clean.stdout
    assert "layer    rank 0   rank 1   rank 2   rank 3" in clean.stdout
    bad = _credit(*common, "diagnostics.sdc.inject.kind=grad_shard",
                  "diagnostics.sdc.inject.layer=layers.1.attn.to_v", "diagnostics.sdc.inject.rank=2",
                  "diagnostics.sdc.inject.step=2")
    assert bad.returncode == 1, bad.stdout[-3000:] + bad.stderr[-3000:]
    assert "MISMATCH iteration 2 rank 2 layers.1.attn.to_v comm (reduce_scatter)" in bad.stdout
    table = bad.stdout.split("rank 3\n")[1].splitlines()
    assert table[1].split()[3] == "1" and table[0].split()[1:] == ["ok"] * 4
