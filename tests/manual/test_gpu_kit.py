"""The GPU kit's dry run: every step of manual_tests/gpu/run.sh on CPU at tiny sizes, so the
kit a lent GPU machine runs cannot rot between the sessions that get one.

The kit's `python` here is tests/warm_python.py's: each of the kit's thirty-odd interpreters
(and their own `sys.executable` children) forks from one that imported torch and this package
once, instead of importing them again (most of a dry run's CPU otherwise)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from warm_python import WarmPython

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def python(tmp_path_factory):
    with WarmPython(tmp_path_factory.mktemp("warm_python")) as warm:
        yield warm.executable


@pytest.mark.timeout(1800)  # nine steps, each a fresh process; the first may compile the CPU GEMM
def test_dry_run_runs_every_step_and_writes_the_reports(tmp_path, python):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": python,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(REPO / "manual_tests/gpu/run.sh"), "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=1800)
    log = (out / "kit_cpu_dry_run.log").read_text() if (out / "kit_cpu_dry_run.log").exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + log[-6000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "determinism_cpu_dry_run.md", "determinism_cpu_dry_run_crossformer.md", "determinism_cpu_dry_run_wxformer.md",
        "ensemble_cpu_dry_run.md", "gemm_cpu_dry_run.md", "kit_cpu_dry_run.log", "kit_cpu_dry_run.md"]

    kit = (out / "kit_cpu_dry_run.md").read_text()
    steps = [line for line in kit.splitlines() if line.startswith("| ") and line.count("|") == 4][2:]
    assert [s.split("|")[1].strip() for s in steps] == [
        "kernel tests", "train fast", "train deterministic (1)", "train deterministic (2)",
        "deterministic runs hold the same bits", "benchmarks/determinism.py",
        "benchmarks/determinism.py model=wxformer", "benchmarks/determinism.py model=crossformer",
        "benchmarks/gemm.py", "benchmarks/ensemble.py"]
    assert all(s.split("|")[2].strip() == "passed" for s in steps), kit
    assert "torch " + __import__("torch").__version__ in kit
    assert "tests collected" in kit.split("Kernel tests: ")[1].splitlines()[0]  # pytest's own line
    assert "Two deterministic runs hold the same bits (metrics and every checkpoint tensor): **yes**" in kit
    train_rows = [line for line in kit.splitlines() if line.startswith(("| fast |", "| det1 |", "| det2 |"))]
    assert [r.split("|")[3].strip() for r in train_rows] == ["fast", "deterministic", "deterministic"]
    assert all(r.split("|")[5].strip() == "4" for r in train_rows)  # steps trained

    ensemble = (out / "ensemble_cpu_dry_run.md").read_text()
    assert "| 1 | one rank | (1, 1) |" in ensemble and "members a sample" in ensemble, ensemble
    gemm = (out / "gemm_cpu_dry_run.md").read_text()
    assert "## backend cpu on" in gemm and "| float32 | 8x64x64 |" in gemm  # the experiment's shapes
    assert "## backend triton: not available on this machine (no CUDA GPU)" in gemm
    for name, model in [("", None), ("_wxformer", "wxformer"), ("_crossformer", "crossformer")]:
        determinism = (out / f"determinism_cpu_dry_run{name}.md").read_text()
        assert "| median step (s) |" in determinism and "--device cpu --steps 2" in determinism
        assert (f"with model={model}" in determinism) == bool(model), determinism
        # the default experiment's is profiled by operation family (on a GPU, kernel time too)
        assert ("self CPU time by operation family" in determinism) == (model is None), determinism


def test_out_of_time_the_report_says_which_steps_did_not_run(tmp_path, python):
    """The device tool stops a command at its limit: the kit keeps to KIT_BUDGET_S and its
    report, rewritten after every step, names what it had no time for; the exit is non-zero."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": python, "KIT_BUDGET_S": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(REPO / "manual_tests/gpu/run.sh"), "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "failed steps: kernel tests train fast" in proc.stderr
    kit = (out / "kit_cpu_dry_run.md").read_text()
    steps = [line for line in kit.splitlines() if line.startswith("| ") and line.count("|") == 4][2:]
    assert len(steps) == 10 and all("**not run**: the kit's 1 s were spent" in s for s in steps), kit
    assert "**not checked (out of time)**" in kit
    assert "| fast | no finished run in" in kit


@pytest.mark.timeout(1200)
def test_sizes_dry_run_writes_every_table_named_after_the_commit(tmp_path, python):
    """`run.sh --sizes`: the kit at CREDIT's sizes (1-degree steps of the three classes with
    their profile, the 0.25-degree fast step, the kernel tests, the GEMM table, the default
    experiment; the graphed steps need a GPU), on CPU at a shrunk section; every file named
    after the machine and the commit."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": python, "KIT_COMMIT": "abc1234",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(REPO / "manual_tests/gpu/run.sh"), "--sizes", "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=1200)
    name = "cpu_dry_run_abc1234"
    log = (out / f"sizes_{name}.log").read_text() if (out / f"sizes_{name}.log").exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + log[-6000:]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{kind}_{name}.{ext}" for kind, ext in [("determinism", "md"), ("gemm_sizes", "md"), ("kernel_tests", "log"),
                                                 ("sizes", "log"), ("sizes", "md"), ("step_0.25deg", "md"),
                                                 ("step_1deg", "md")])
    report = (out / f"sizes_{name}.md").read_text()
    steps = [line for line in report.splitlines() if line.startswith("| ") and line.count("|") == 4][2:]
    outcomes = {s.split("|")[1].strip(): s.split("|")[2].strip() for s in steps}
    assert list(outcomes) == [
        "benchmarks/step_at_size.py 1 degree, three classes", "benchmarks/step_at_size.py 0.25 degree, fast",
        "benchmarks/step_graphs.py 1 degree", "kernel tests", "benchmarks/gemm.py", "benchmarks/determinism.py"]
    graphs = outcomes.pop("benchmarks/step_graphs.py 1 degree")
    assert graphs == "not run: captures CUDA graphs, needs a GPU", report
    assert set(outcomes.values()) == {"passed"}, report
    assert "`bash manual_tests/gpu/run.sh --sizes --dry-run` at abc1234" in report

    one_degree = (out / f"step_1deg_{name}.md").read_text()
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in one_degree.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip() in ("wxformer", "crossformer", "nextgen_wxformer")}
    # the padded classes run on the section's grid; nextgen_wxformer, which pads nothing, on the
    # nearest grid its windows tile
    assert rows == {"wxformer": "40x40", "crossformer": "40x40", "nextgen_wxformer": "64x64"}, one_degree
    for model in rows:
        assert f"## {model}: median of 1 profiled steps per mode, self CPU time by operation family" in one_degree
    assert "| det / fast (per-pair range) |" in one_degree and "| fast TFLOP per step |" in one_degree
    quarter = (out / f"step_0.25deg_{name}.md").read_text()
    assert "| fast step (ms) |" in quarter and "deterministic step" not in quarter
    gemm = (out / f"gemm_sizes_{name}.md").read_text()
    assert "det forward as one chain over K (`--whole-k`)" in gemm and "## backend cpu on" in gemm


def test_the_kit_runs_without_the_packages_it_does_not_carry(tmp_path):
    """prepare.sh carries no zarr stack (the tracked tree leaves the wheels ~15 of the 64 MiB a
    device call carries): the kit's modules import, and make a dataset, without zarr and
    numcodecs, which only zarr data needs."""
    carried = (REPO / "manual_tests/gpu/prepare.sh").read_text()
    assert "zarr" not in carried.split("MISSING=(")[1].split(")")[0]
    code = (
        "import sys\n"
        "for name in ('zarr', 'numcodecs', 'donfig', 'google_crc32c'):\n"
        "    sys.modules[name] = None  # import of it raises ImportError\n"
        "sys.path.insert(0, 'benchmarks')\n"
        "import credit.cli, credit.train.trainer, credit.interop.checkpoint_import, step_at_size, step_graphs, gemm\n"
        "from credit.data.generate import generate_dataset\n"
        "out = generate_dataset(sys.argv[1], grid=(8, 16), years=(2000,), levels=(500,), days_per_year=2,\n"
        "                       progress=False)\n"
        "assert sorted(p.suffix for p in out.rglob('*.nc')) and not list(out.rglob('*.zarr'))\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "data")], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
