"""Sharded DCP checkpoints: atomic publication, retention, crash safety."""

import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from credit.checkpoint.manager import CheckpointError, CheckpointManager, checkpoint_keys, load_checkpoint


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((4, 4), value)}, "progress": {"step": int(value)}}


def test_save_publishes_complete_directories_and_keeps_latest_k(tmp_path):
    manager = CheckpointManager(tmp_path / "ckpt", keep_latest_k=2)
    for step in (1, 2, 3):
        path = manager.save(step, _state(step))
        assert path.name == f"step_{step:08d}" and (path / ".metadata").is_file()
    assert [s for s, _ in manager.complete_checkpoints()] == [2, 3]
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".partial")]
    loaded = _state(0)
    load_checkpoint(manager.latest(), loaded)
    assert torch.equal(loaded["model"]["w"], torch.full((4, 4), 3.0))
    assert loaded["progress"]["step"] == 3
    assert {"model.w", "progress.step"} <= checkpoint_keys(manager.latest())


def test_saving_the_same_step_again_replaces_it(tmp_path):
    manager = CheckpointManager(tmp_path, keep_latest_k=3)
    manager.save(5, _state(1.0))
    manager.save(5, _state(2.0))
    loaded = _state(0)
    load_checkpoint(manager.step_dir(5), loaded)
    assert loaded["model"]["w"][0, 0] == 2.0
    assert [s for s, _ in manager.complete_checkpoints()] == [5]


def test_loading_an_incomplete_directory_is_an_error(tmp_path):
    (tmp_path / "step_00000001").mkdir()
    with pytest.raises(CheckpointError, match="not a complete DCP checkpoint directory: no .metadata"):
        load_checkpoint(tmp_path / "step_00000001", _state(0))
    assert CheckpointManager(tmp_path, 1).latest() is None


def _damage(path, how):
    data = sorted(path.glob("*.distcp"))[0]
    if how == "no metadata":
        (path / ".metadata").unlink()
    elif how == "missing data":
        data.unlink()
    else:  # copied half-way: .metadata there, the data cut short
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])


@pytest.mark.parametrize("how, problem", [
    ("no metadata", "no .metadata"),
    ("missing data", r"data file __0_0\.distcp is missing"),
    ("truncated", r"data file __0_0\.distcp is truncated \(\d+ of \d+ bytes\)"),
])
def test_a_damaged_checkpoint_is_named_never_counted_and_never_costs_a_good_one(tmp_path, how, problem):
    manager = CheckpointManager(tmp_path, keep_latest_k=2)
    for step in (1, 2):
        manager.save(step, _state(step))
    _damage(manager.step_dir(2), how)
    assert [s for s, _ in manager.complete_checkpoints()] == [1]  # 2 is not counted
    assert manager.latest() == manager.step_dir(1)
    (damaged, why), = manager.damaged_checkpoints()
    assert damaged == manager.step_dir(2) and re.fullmatch(problem + ".*", why)
    with pytest.raises(CheckpointError, match=f"{manager.step_dir(2)} is not a complete DCP checkpoint directory: {problem}"):
        load_checkpoint(manager.step_dir(2), _state(0))
    manager.save(3, _state(3))  # two good ones remain (1 and 3); the damaged 2 is left alone
    assert [s for s, _ in manager.complete_checkpoints()] == [1, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001", "step_00000002", "step_00000003"]


def test_keep_latest_k_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="keep_latest_k=0"):
        CheckpointManager(tmp_path, keep_latest_k=0)


CRASHING_SAVE = textwrap.dedent(
    """
    import sys, time, torch
    from credit.checkpoint.manager import CheckpointManager

    class SlowToWrite:
        # Pickled while DCP writes the checkpoint: stalls the save half-way.
        def __reduce__(self):
            print("writing", flush=True)
            time.sleep(60)
            return (int, (0,))

    manager = CheckpointManager(sys.argv[1], keep_latest_k=1)
    manager.save(1, {"model": {"w": torch.ones(64, 64)}, "progress": {"step": 1}})
    print("saved 1", flush=True)
    manager.save(2, {"model": {"w": torch.zeros(64, 64)}, "progress": {"step": 2},
                     "extra": {"slow": SlowToWrite()}})
    """
)


def test_a_crash_mid_save_leaves_the_previous_checkpoint_intact(tmp_path):
    root = tmp_path / "ckpt"
    child = subprocess.Popen(
        [sys.executable, "-c", CRASHING_SAVE, str(root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "saved 1"
        assert child.stdout.readline().strip() == "writing"  # inside dcp.save of step 2
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert (root / ".partial_step_00000002").is_dir()  # the interrupted save
    manager = CheckpointManager(root, keep_latest_k=1)
    assert manager.latest() == root / "step_00000001"
    loaded = {"model": {"w": torch.zeros(64, 64)}, "progress": {"step": 0}}
    load_checkpoint(manager.latest(), loaded)
    assert torch.equal(loaded["model"]["w"], torch.ones(64, 64)) and loaded["progress"]["step"] == 1
    # the next save of that step cleans the partial directory and publishes normally
    manager.save(2, {"model": {"w": torch.zeros(64, 64)}, "progress": {"step": 2}})
    assert sorted(p.name for p in root.iterdir()) == ["step_00000002"]


KILLED_BETWEEN_RENAMES = textwrap.dedent(
    """
    import os, signal, sys, torch
    from pathlib import Path
    from credit.checkpoint.manager import CheckpointManager

    manager = CheckpointManager(sys.argv[1], keep_latest_k=1)
    manager.save(5, {"model": {"w": torch.ones(8, 8)}})
    renames = []
    real_rename = Path.rename

    def rename_then_die(self, target):
        # The re-save of step 5 renames twice (old copy aside, new copy into place):
        # die right before the second, the one moment the old code had no checkpoint.
        if Path(self).parent == Path(sys.argv[1]):  # not DCP's own renames of shard files
            renames.append(target)
        if len(renames) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_rename(self, target)

    Path.rename = rename_then_die
    manager.save(5, {"model": {"w": torch.full((8, 8), 2.0)}})
    """
)


def test_a_kill_while_resaving_a_step_with_keep_1_keeps_a_complete_checkpoint(tmp_path):
    root = tmp_path / "ckpt"
    child = subprocess.run([sys.executable, "-c", KILLED_BETWEEN_RENAMES, str(root)], timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert not (root / "step_00000005").exists()  # killed between the two renames
    manager = CheckpointManager(root, keep_latest_k=1)
    latest = manager.latest()
    assert latest is not None and manager.complete_checkpoints()[-1][0] == 5
    loaded = {"model": {"w": torch.zeros(8, 8)}}
    load_checkpoint(latest, loaded)
    assert torch.equal(loaded["model"]["w"], torch.ones(8, 8))
    # saving that step again publishes it under its own name and drops the old copy
    manager.save(5, {"model": {"w": torch.full((8, 8), 3.0)}})
    assert sorted(p.name for p in root.iterdir()) == ["step_00000005"]
    load_checkpoint(manager.latest(), loaded)
    assert torch.equal(loaded["model"]["w"], torch.full((8, 8), 3.0))
