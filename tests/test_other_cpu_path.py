"""The comparisons with numbers made on another machine (CREDIT's fixtures) hold on a second
CPU code path: those tests rerun in a pytest subprocess with torch's kernels on their scalar
build (`ATEN_CPU_CAPABILITY=default`; transcendental functions, softmax, norms and reductions
round another way) and MKL on its reproducible path (`MKL_CBWR=COMPATIBLE`; another GEMM
blocking). A tolerance tuned to the CPU that made a fixture fails here, on any machine.
docs/testing.md gives the tolerance policy."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
# every comparison with a fixture made by CREDIT's code, each under a few seconds, and CREDIT's continued run
FIXTURE_COMPARISONS = (
    "tests/train/test_losses.py::test_the_loss_is_credits_on_the_same_tensors",
    "tests/train/test_ensemble.py::test_the_crps_is_credits_on_the_same_tensors",
    "tests/config/test_credit_file.py::test_the_mapped_loss_equals_credits_with_latitude_and_variable_weights",
    "tests/data/test_credit_gen1_dataset.py::test_model_input_and_target_equal_credits",
    "tests/data/test_credit_gen2_dataset.py::test_every_steps_input_targets_and_forcing_equal_credits",
    "tests/data/test_credit_bridgescaler.py::test_the_samples_are_credits_bridgescaler_preblocks",
    "tests/data/test_credit_bridgescaler.py::test_the_loss_is_credits_base_loss_on_the_same_tensors",
    "tests/models/test_credit_models.py::test_forward_matches_credit_in_one_process",
    "tests/models/test_credit_postblocks.py::test_post_blocks_on_credits_model_output_are_credits_bit_for_bit",
    "tests/models/test_credit_postblocks.py::test_from_credit_with_post_blocks_forecasts_credits_numbers",
    "tests/checkpoint/test_credit_start.py::test_a_continued_run_takes_credits_next_two_steps",
    "tests/data/test_credit_tisr.py::test_the_field_at_a_time_is_credits",
    "tests/data/test_credit_tisr.py::test_the_samples_of_a_file_with_a_tisr_source_are_credits",
    "tests/data/test_credit_tisr.py::test_the_bridgescaler_preblock_scales_tisr_with_its_own_sources_scaler",
    "tests/data/test_credit_tisr.py::test_tisr_may_be_the_only_dynamic_forcing",
    "tests/data/test_credit_bridgescaler.py::test_learnable_variable_weights_are_credits_base_loss",
    "tests/data/test_credit_bridgescaler.py::test_per_variable_loss_overrides_are_credits",
    "tests/data/test_credit_bridgescaler_spatial.py::test_the_samples_are_credits_per_grid_point_scaling",
    "tests/data/test_credit_bridgescaler_spatial.py::test_the_loss_is_credits_base_loss_and_forecasts_are_its_physical_units",
    "tests/data/test_credit_pointwise_blocks.py::test_the_samples_are_credits_transformed_then_scaled",
    "tests/data/test_credit_pointwise_blocks.py::test_the_loss_and_the_forecast_are_credits_through_the_inverse_blocks",
    "tests/data/test_credit_pointwise_blocks.py::test_fill_values_is_credits_on_nan_bounds_and_overlaps",
    "tests/data/test_credit_geopotential.py::test_the_geopotential_is_credits_postblock",
    "tests/data/test_credit_geopotential.py::test_the_loss_scores_the_computed_geopotential_as_credits_base_loss",
    "tests/data/test_credit_geopotential.py::test_a_scaler_of_the_computed_key_weighs_it_as_base_loss_does",
    "tests/models/test_credit_ensemble_model.py::test_forward_is_credits_for_its_recorded_noise",
    "tests/config/test_credit_file.py::test_the_mapped_schedule_gives_credits_learning_rates",
)


def other_cpu_path() -> dict[str, str]:
    """The environment of a second code path: the scalar kernels unless they already run
    (a CPU without AVX2), and MKL's conditional-numerical-reproducibility path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "ATEN_CPU_", "MKL_CBWR"))}
    env.update(MKL_CBWR="COMPATIBLE", OMP_NUM_THREADS="1")
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        env["ATEN_CPU_CAPABILITY"] = "default"
    return env


# pytest in a subprocess that first says which kernels torch picked
_PYTEST = ("import sys, pytest, torch; print('capability', torch.backends.cpu.get_cpu_capability(), flush=True); "
           "sys.exit(pytest.main(sys.argv[1:]))")


def test_fixture_comparisons_hold_on_another_cpu_path(tmp_path):
    env = other_cpu_path()
    report = tmp_path / "report.xml"
    run = subprocess.run([sys.executable, "-c", _PYTEST, "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                          *FIXTURE_COMPARISONS], cwd=REPO, env=env, capture_output=True, text=True, timeout=540)
    assert run.returncode == 0, run.stdout[-6000:]
    if "ATEN_CPU_CAPABILITY" in env:  # the subprocess really ran the other kernels
        assert run.stdout.startswith("capability DEFAULT"), run.stdout[:200]
    suite = ET.parse(report).getroot().find("testsuite")
    passed: dict[str, int] = {}
    for case in suite.iter("testcase"):
        assert not any(child.tag in ("failure", "error", "skipped") for child in case), ET.tostring(case)[:2000]
        node = case.get("classname").replace(".", "/") + ".py::" + case.get("name").split("[")[0]
        passed[node] = passed.get(node, 0) + 1
    # every named test ran, each parametrization passed, none skipped
    assert sorted(passed) == sorted(FIXTURE_COMPARISONS), passed
    assert sum(passed.values()) == int(suite.get("tests")) > len(FIXTURE_COMPARISONS)


# Modules that read a fixture of CREDIT's outputs but are not rerun above: they launch ranks
# (minutes under the scalar kernels) and compare the multi-rank run against CREDIT's output
# with the tolerances of the one-process comparisons the list holds.
MULTI_RANK_COMPARISONS = {"tests/parallel/test_credit_tp.py", "tests/parallel/test_credit_resume.py",
                          "tests/parallel/test_ensemble_gather.py"}


def test_every_module_reading_credits_outputs_is_rerun_here():
    """A module that loads a fixture of CREDIT's outputs (`torch.load` in a module that names a
    FIXTURE or a tests/fixtures/credit_* folder) has a test in the list, so its tolerances meet
    a second CPU path."""
    listed = {node.split("::")[0] for node in FIXTURE_COMPARISONS}
    readers = set()
    for path in (REPO / "tests").rglob("test_*.py"):
        source = path.read_text()
        if path == Path(__file__).resolve():
            continue
        if "torch.load(" in source and ("FIXTURE" in source or '"credit_' in source):
            readers.add(str(path.relative_to(REPO)))
    assert readers - MULTI_RANK_COMPARISONS <= listed, sorted(readers - MULTI_RANK_COMPARISONS - listed)
    assert listed <= readers, sorted(listed - readers)
