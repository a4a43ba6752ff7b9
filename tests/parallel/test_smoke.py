"""The multi-rank smoke test of the quick tier (`make test-quick`): `credit train --nproc 4`
of the default model at dp2 x tp2 (FSDP2 + TP) for two steps, as a user launches it, with
the plain progress lines a batch job's log gets."""

import os
import subprocess
import sys

from tiny import tiny_data_overrides

from credit.train.metrics import read_metrics


def test_default_model_trains_two_steps_at_dp2_tp2(tiny_data, tmp_path):
    run = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "credit.cli", "train", "--nproc", "4", "parallelism=fsdp2_tp2",
         *tiny_data_overrides(tiny_data, f"run_dir={run}", "trainer.batch_size=2", "trainer.max_steps=2",
                              "trainer.progress_bar=true", "trainer.log_every_n_steps=1",
                              "trainer.valid_every_n_steps=0")],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert "world 4 = dp 2 x tp 2" in log and "training nextgen_wxformer" in log
    # no library noise from the ranks: runpy's re-import warning, matplotlib's font search
    # (the loss plot's log axis), each printed once per rank before they were fixed
    assert "Warning" not in log and "findfont" not in log, log[-3000:]
    assert "step 2/2" in log and " MiB " in log.split("step 2/2")[1].splitlines()[0]  # the peak
    rows = read_metrics(run / "metrics.csv")
    assert [r["step"] for r in rows] == ["1", "2"] and all(float(r["peak_mem_mib"]) > 50 for r in rows)
    assert (run / "checkpoints" / "step_00000002" / ".metadata").is_file()
