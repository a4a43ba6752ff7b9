"""The SDC detector's parts in one process: raw-bit checksums, the bit flip, the modal
verdict, config errors (one line, exit 2), and the compute check catching an injected
GEMM-output fault in a real single-process training run (action=stop: exit 3, nothing saved
after the last verified step)."""

import json
import os

import numpy as np
import pytest
from launches import credit_command
import torch

from credit.diagnostics.checksum import bit_checksum, chunk_checksums, flip_bit
from credit.diagnostics.verdict import disagreeing

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _credit(*args, timeout=300):
    return credit_command(*args, env=ENV, timeout=timeout)


@pytest.mark.parametrize("dtype,int_type", [(torch.float32, np.int32), (torch.bfloat16, np.int16),
                                            (torch.float16, np.int16)])
def test_checksum_is_the_int64_sum_of_raw_bits(dtype, int_type):
    values = torch.randn(37, 5).to(dtype)
    values[0, 0] = float("nan")
    raw = values.view(torch.int32 if int_type is np.int32 else torch.int16).numpy().astype(np.int64)
    assert int(bit_checksum(values)) == int(raw.sum())
    blocks = chunk_checksums(values, 4)  # torch.chunk's rows: 10, 10, 10, 7
    assert blocks.tolist() == [int(raw[i:i + 10].sum()) for i in range(0, 37, 10)]
    assert chunk_checksums(torch.ones(2, 3), 4).tolist()[2:] == [0, 0]  # empty trailing shards


@pytest.mark.parametrize("bit", [0, 22, 30, 31])
def test_flip_bit_flips_exactly_one_bit(bit):
    values = torch.randn(4, 6)
    before = values.clone()
    flip_bit(values, 9, bit)
    xor = (values.view(torch.int32) ^ before.view(torch.int32)).view(-1)
    assert xor[9].item() & 0xFFFFFFFF == 1 << bit
    assert torch.count_nonzero(xor) == 1
    with pytest.raises(ValueError, match="0..31"):
        flip_bit(values, 0, 32)
    with pytest.raises(ValueError, match="inject.index=24"):
        flip_bit(values, 24, 0)


def test_the_modal_value_is_the_reference_not_rank_0():
    assert disagreeing({0: 5, 1: 5, 2: 5}) == (5, [], None)
    assert disagreeing({0: 7, 1: 5, 2: 5, 3: 5}) == (5, [0], None)  # rank 0 alone is wrong
    expected, ranks, candidates = disagreeing({0: 5, 1: 7})  # two copies, no majority
    assert expected is None and ranks == [0, 1] and candidates == {"5": [0], "7": [1]}


@pytest.mark.parametrize("override,message", [
    ("diagnostics.sdc.checks=[comm,replca]", "diagnostics.sdc.checks=['comm', 'replca'] is invalid"),
    ("diagnostics.sdc.action=rolback", "diagnostics.sdc.action='rolback' is invalid"),
    ("diagnostics.sdc.chekcs=[comm]", "diagnostics.sdc.chekcs"),
    ("diagnostics.sdc.inject.kind=gemm", "diagnostics.sdc.inject.kind='gemm' is invalid"),
])
def test_a_typo_is_one_error_line(override, message):
    result = _credit("check", "diagnostics.sdc.enabled=true", override)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr


def test_an_injection_must_land_on_a_checked_step():
    result = _credit("check", "diagnostics.sdc.enabled=true", "diagnostics.sdc.every_n_steps=5",
                     "diagnostics.sdc.inject.kind=gemm_output", "diagnostics.sdc.inject.layer=x",
                     "diagnostics.sdc.inject.step=7")
    assert result.returncode == 2 and "must be a checked step" in result.stderr


def test_a_check_with_nothing_to_compare_is_an_error(tiny_overrides, tmp_path):
    result = _credit("train", *tiny_overrides(tmp_path / "run"), "trainer.max_steps=2",
                     "diagnostics.sdc.enabled=true", "diagnostics.sdc.checks=[comm,compute]")
    assert result.returncode == 2, result.stderr
    assert "includes 'comm', but this run has no FSDP2 unit" in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_compute_check_stops_a_single_process_run(tiny_overrides, tmp_path):
    run = tmp_path / "run"
    result = _credit("train", *tiny_overrides(run), "trainer.max_steps=6",
                     "trainer.checkpoint.every_n_steps=2", "trainer.valid_every_n_steps=0",
                     "diagnostics.sdc.enabled=true", "diagnostics.sdc.every_n_steps=2",
                     "diagnostics.sdc.checks=[compute]", "diagnostics.sdc.action=stop",
                     "diagnostics.sdc.inject.kind=gemm_output",
                     "diagnostics.sdc.inject.layer=stages.1.layers.0.1.down",
                     "diagnostics.sdc.inject.step=4", "diagnostics.sdc.inject.index=3")
    assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-2000:]
    assert "sdc checks ON every 2 steps: compute (" in result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "silent data corruption at step 4" in errors[0]
    (record,) = [json.loads(line) for line in (run / "sdc.jsonl").read_text().splitlines()]
    assert (record["step"], record["rank"], record["layer"], record["path"]) == \
        (4, 0, "stages.1.layers.0.1.down", "compute")
    saved = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert saved == ["step_00000002"]  # nothing of the corrupted step
