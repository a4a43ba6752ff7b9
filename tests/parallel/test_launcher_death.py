"""No rank outlives its launcher. `credit train --nproc 2` whose launcher is killed mid-run
(SIGKILL, as the OOM killer or an impatient user does; SIGTERM, as a scheduler does) leaves no
process of the launch behind within seconds, so the run directory is free and
`trainer.resume=auto` goes on from the last checkpoint; a failed launch leaves none either.

Real launches of the tiny model (checkpoint at every step); each launch's processes are
found by a marker in their environment (`processes.launch_processes`), so the launches of
other test workers never count."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from processes import kill_last_rank, launch_processes, rank_of

from credit.checkpoint.manager import CheckpointManager
from credit.train.run_lock import acquire

RANKS_GONE_S = 5  # ranks and forkserver: the kernel ends them at once (room for a loaded machine)
ALL_GONE_S = 15  # DataLoader workers check their parent every 5 s (torch); the tracker waits for them


def _launch(tiny_overrides, run: Path, log: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """Start `credit train --nproc 2` (output to `log`); returns it and its marker."""
    name, value = "CREDIT_TEST_LAUNCH", uuid.uuid4().hex
    env = {**os.environ, "OMP_NUM_THREADS": "1", name: value}
    command = [sys.executable, "-m", "credit.cli", "train", "--nproc", "2", "parallelism=ddp",
               *tiny_overrides(run, "trainer.max_steps=500", "trainer.checkpoint.every_n_steps=1",
                               "trainer.valid_every_n_steps=0", *extra)]
    with open(log, "w") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT), f"{name}={value}"


def _wait_until(condition, agent: subprocess.Popen, log: Path, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert agent.poll() is None, f"the launch ended (code {agent.returncode}) before {what}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


def _latest_step(run: Path) -> int:
    checkpoints = CheckpointManager(run / "checkpoints", keep_latest_k=2).complete_checkpoints()
    return checkpoints[-1][0] if checkpoints else 0


def _assert_every_process_ends(marker: str, ranks_and_server: set[int] = frozenset()) -> None:
    """`ranks_and_server` end within RANKS_GONE_S of the launcher, every process of the
    launch within ALL_GONE_S."""
    start, late = time.monotonic(), {}
    while (left := launch_processes(marker)) and time.monotonic() < start + ALL_GONE_S:
        if time.monotonic() > start + RANKS_GONE_S and ranks_and_server & set(left):
            late = left
            break
        time.sleep(0.1)
    for pid in left:  # nothing outlives the test, whatever it found
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not late, f"ranks or forkserver alive {RANKS_GONE_S} s after the launcher ended: {late}"
    assert not left, f"alive {ALL_GONE_S} s after the launcher ended: {left}"


def _ranks_and_server(agent: subprocess.Popen, marker: str) -> set[int]:
    """The launch's two ranks and their forkserver, the launcher's child: the marker finds
    them (else a check that nothing is left would prove nothing). A DataLoader worker bears
    its rank's name until torch renames it, so a rank is one whose parent is no rank."""
    found = launch_processes(marker)
    ranks = {rank_of(pid): (pid, parent) for pid, (_, parent) in found.items()
             if rank_of(pid) is not None and rank_of(parent) is None}
    assert sorted(ranks) == [0, 1], found
    servers = {parent for _, parent in ranks.values()}
    assert len(servers) == 1 and found[next(iter(servers))][1] == agent.pid, found
    return {pid for pid, _ in ranks.values()} | servers


def test_a_killed_launcher_leaves_no_rank_and_the_run_resumes(tiny_overrides, tmp_path):
    run = tmp_path / "run"
    # with a DataLoader worker per rank: it too ends (a worker is the rank's own child)
    agent, marker = _launch(tiny_overrides, run, tmp_path / "first.log", "data.num_workers=1")
    try:
        _wait_until(lambda: _latest_step(run) >= 2, agent, tmp_path / "first.log", "a checkpoint at step 2")
        launch = _ranks_and_server(agent, marker)
        agent.kill()
        agent.wait()
    finally:
        agent.kill()
    _assert_every_process_ends(marker, launch)
    os.close(acquire(run))  # rank 0 has let go of the run directory
    checkpoints = CheckpointManager(run / "checkpoints", keep_latest_k=2)
    last, path = checkpoints.complete_checkpoints()[-1]

    log = tmp_path / "resumed.log"
    agent, marker = _launch(tiny_overrides, run, log, "trainer.resume=auto")
    try:
        _wait_until(lambda: _latest_step(run) > last, agent, log, f"a checkpoint after step {last}")
        launch = _ranks_and_server(agent, marker)
        agent.send_signal(signal.SIGTERM)  # a scheduler's stop: the agent stops the ranks
        assert agent.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        agent.kill()
    _assert_every_process_ends(marker, launch)
    text = log.read_text()
    assert f"resumed from {path} at step {last}" in text, text[-3000:]
    assert "error: the launch got SIGTERM; its 2 ranks were stopped" in text.splitlines(), text[-3000:]


@pytest.mark.parametrize("failure", ["run_dir in use", "rank killed"])
def test_a_failed_launch_leaves_no_process(failure, tiny_overrides, tmp_path):
    run, log = tmp_path / "run", tmp_path / "launch.log"
    lock = acquire(run) if failure == "run_dir in use" else None  # rank 0 refuses the run
    try:
        agent, marker = _launch(tiny_overrides, run, log)
        try:
            if failure == "rank killed":  # as soon as both ranks run: the other is stopped
                _wait_until(lambda: len([p for p in launch_processes(marker) if rank_of(p) is not None]) == 2,
                            agent, log, "both ranks")
                assert kill_last_rank(agent.pid) == 1
            assert agent.wait(timeout=300) == 2, log.read_text()[-3000:]
        finally:
            agent.kill()
    finally:
        if lock is not None:
            os.close(lock)
    _assert_every_process_ends(marker)
    errors = [line for line in log.read_text().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and ("is in use by" in errors[0] if lock is not None else
                                 "0 of 2 ranks finished; the launch failed" in errors[0]), log.read_text()[-3000:]


def lose_a_peer(args: list[str]) -> int:
    """A rank's main: rank 1 closes its connections while rank 0 waits in a collective (as a
    killed rank's kernel does, but with the process left alive, so that no launcher stops rank
    0 first); rank 0's collective fails on the closed connection, and `credit.cli` reports it."""
    import torch
    import torch.distributed as dist

    from credit.cli import unexpected_error

    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 1:  # once rank 0 waits in the collective
        time.sleep(0.5)
        dist.destroy_process_group()
        time.sleep(60)  # the agent stops it once rank 0 has failed
        return 0
    try:
        dist.all_reduce(torch.ones(4))
    except RuntimeError as error:
        return unexpected_error(error)
    return 0


def test_a_collective_that_loses_its_peer_is_a_warning_not_the_error_line(tmp_path):
    """The rank that survives a killed peer says why its collective stopped as a warning and
    exits LOST_PEER, so the one `error:` line is the launcher's, about the rank that died."""
    from launches import output_to

    from credit.cli import LOST_PEER
    from credit.launch import launch

    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND) for p in (out, err)]
    try:
        with output_to(*fds):
            succeeded, codes = launch(2, lose_a_peer, ["peer"])
    finally:
        for fd in fds:
            os.close(fd)
    text = err.read_text()
    assert not succeeded and codes == [LOST_PEER], text[-2000:]  # rank 1 was stopped after rank 0 failed
    assert "warning: rank 0: a collective stopped because another rank's process ended (RuntimeError: " in text
    assert "error:" not in text
