"""Sharded checkpoints: one `torch.distributed.checkpoint` directory per saved step.

Layout under `<run_dir>/checkpoints/`:
  step_00000100/           a complete checkpoint (DCP shards + `.metadata`)
  .partial_step_00000200/  a save in progress; never read, removed by the next save
  step_00000100.previous/  the older copy of a step saved again, while the new copy moves
                           into place; read only when step_00000100/ is absent

A save writes into the partial directory and, once every rank has finished writing,
rank 0 renames it into place. A crash mid-save therefore leaves the previous complete
checkpoint untouched, and resume never sees a half-written one. Saving a step that
already exists (a job resumed and stopped at the same step) moves the old copy aside
under a name that still counts as that step's checkpoint, so a crash between the two
renames leaves one complete copy to resume from, even with `keep_latest_k=1`.
"""

from __future__ import annotations

import logging
import re
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d{8})(\.previous)?$")
_PARTIAL_PREFIX = ".partial_"
_PREVIOUS_SUFFIX = ".previous"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or whose contents do not fit the run."""


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _is_writer() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


@contextmanager
def _quiet_single_process():
    """DCP warns when it runs without a process group; for one process that is intended."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def checkpoint_problem(path: Path) -> str | None:
    """Why `path` is not a complete DCP checkpoint, or None when it is: `.metadata` (which
    DCP writes last) present and readable, and every data file it names present and at
    least as long as the bytes it records there (a directory copied half-way may have its
    `.metadata` and lack data)."""
    path = Path(path)
    if not path.is_dir():
        return "not a directory"
    if not (path / ".metadata").is_file():
        return "no .metadata (the save or a copy of it did not finish)"
    try:
        metadata = dcp.FileSystemReader(str(path)).read_metadata()
    except Exception as error:  # unpickling errors come in many types; name the first line
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f".metadata cannot be read ({first})"
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        data = path / name
        if not data.is_file():
            return f"data file {name} is missing"
        if data.stat().st_size < size:
            return f"data file {name} is truncated ({data.stat().st_size} of {size} bytes)"
    return None


def is_complete_checkpoint(path: Path) -> bool:
    """A DCP directory whose save finished and whose data files are all there."""
    return checkpoint_problem(path) is None


def checkpoint_keys(path: str | Path) -> set[str]:
    """Flattened keys stored in a DCP checkpoint, e.g. `model.head.weight`, `rng.rank0`."""
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    return set(metadata.state_dict_metadata)


class CheckpointManager:
    """Save, find and load step checkpoints under `root`, keeping the latest `keep_latest_k`."""

    def __init__(self, root: str | Path, keep_latest_k: int) -> None:
        if keep_latest_k < 1:
            raise ValueError(f"trainer.checkpoint.keep_latest_k={keep_latest_k} must be >= 1")
        self.root = Path(root)
        self.keep_latest_k = keep_latest_k

    def step_dir(self, step: int) -> Path:
        return self.root / f"step_{step:08d}"

    def _step_dirs(self) -> list[tuple[int, Path, str | None]]:
        """(step, path, problem or None) of every step directory, in name order."""
        if not self.root.is_dir():
            return []
        found = []
        for path in sorted(self.root.iterdir()):  # step_X sorts before step_X.previous
            match = _STEP_DIR.match(path.name)
            if match:
                found.append((int(match.group(1)), path, checkpoint_problem(path)))
        return found

    def complete_checkpoints(self) -> list[tuple[int, Path]]:
        """(step, path) of every complete checkpoint, oldest first; a step's `.previous`
        copy stands in for it only while the step's own directory is not complete.
        Damaged directories are never counted (`damaged_checkpoints`)."""
        found: dict[int, Path] = {}
        for step, path, problem in self._step_dirs():
            if problem is None:
                found.setdefault(step, path)
        return sorted(found.items())

    def damaged_checkpoints(self) -> list[tuple[Path, str]]:
        """(path, what is wrong) of every step directory that is not a complete checkpoint
        (a step's `.previous` copy left beside a complete directory is not listed)."""
        complete = {step for step, _ in self.complete_checkpoints()}
        return [(path, problem) for step, path, problem in self._step_dirs()
                if problem is not None and not (path.name.endswith(_PREVIOUS_SUFFIX) and step in complete)]

    def latest(self) -> Path | None:
        checkpoints = self.complete_checkpoints()
        return checkpoints[-1][1] if checkpoints else None

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Write `state` (a DCP state dict) as the checkpoint of `step`; all ranks call this."""
        final = self.step_dir(step)
        partial = self.root / f"{_PARTIAL_PREFIX}{final.name}"
        if _is_writer():
            self.root.mkdir(parents=True, exist_ok=True)
            if partial.exists():
                shutil.rmtree(partial)
        _barrier()
        with _quiet_single_process():
            dcp.save(state, checkpoint_id=str(partial))
        _barrier()
        if _is_writer():
            self._publish(partial, final)
            self._retain()
        _barrier()
        return final

    def _publish(self, partial: Path, final: Path) -> None:
        previous = final.with_name(final.name + _PREVIOUS_SUFFIX)
        if previous.exists() and final.exists():  # left by a crash in an earlier re-save
            shutil.rmtree(previous)
        if final.exists():
            # Same step saved again: the old copy keeps counting as this step's checkpoint
            # (complete_checkpoints reads `.previous`) until the new copy is in place.
            final.rename(previous)
        partial.rename(final)
        if previous.exists():
            shutil.rmtree(previous)

    def _retain(self) -> None:
        # only complete checkpoints count and are removed: the newest keep_latest_k (>= 1)
        # good ones always stay, and damaged directories are left for the user to inspect
        checkpoints = self.complete_checkpoints()
        for _, path in checkpoints[: -self.keep_latest_k]:
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed old checkpoint %s (keep_latest_k=%d)", path, self.keep_latest_k)


def load_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Load a DCP checkpoint into `state` in place (every key of `state` must be stored)."""
    path = Path(path)
    problem = checkpoint_problem(path)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path} is not a complete DCP checkpoint directory: {problem}")
    with _quiet_single_process():
        dcp.load(state, checkpoint_id=str(path))
