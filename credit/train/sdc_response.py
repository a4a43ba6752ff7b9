"""What the trainer does when a checked step finds corrupted data (`diagnostics.sdc.action`).

warn: report and train on. stop: raise `SDCError` before anything of the corrupted step is
saved. rollback: return the newest complete checkpoint at or before the last step whose
checks passed (a checkpoint saved after it may hold corrupted weights); the trainer reloads
it and replays from there with the same data and randomness, skipping nothing. A second
detection at the same step after a rollback is a persistent fault, not a transient one:
rolling back again would loop, so it stops.
"""

from __future__ import annotations

import logging
from pathlib import Path

from credit.checkpoint.manager import CheckpointManager
from credit.diagnostics import SDCError, StepReport

log = logging.getLogger(__name__)


class SDCResponse:
    def __init__(self, action: str, start_step: int, journal: Path, is_main: bool) -> None:
        self.action = action
        self.is_main = is_main  # every rank decides alike; rank 0 says so
        self.last_verified = start_step  # the run's starting weights are taken as good
        self.rollbacks = 0
        self.journal = journal
        self._rolled_back_at: set[int] = set()

    def columns(self, report: StepReport) -> dict[str, int]:
        return {"sdc_checks_run": report.checks_run, "layers_verified": report.layers_verified,
                "layer_checksum_mismatches": len(report.corrupted_layers),
                "sdc_rollbacks": self.rollbacks}

    def after_step(self, step: int, report: StepReport, checkpoints: CheckpointManager) -> Path | None:
        """None to go on; a checkpoint to roll back to; raises SDCError to stop."""
        if not report.mismatches:
            if report.checks_run:
                self.last_verified = step
            return None
        where = (f"step {step}: {len(report.mismatches)} mismatch(es) in "
                 f"{', '.join(report.corrupted_layers)} (details: {self.journal})")
        if self.action == "warn":
            if self.is_main:
                log.warning("silent data corruption at %s; training on (diagnostics.sdc.action=warn)", where)
            return None
        if self.action == "stop":
            raise SDCError(f"silent data corruption at {where}; stopped (diagnostics.sdc.action=stop); "
                           f"the last verified step is {self.last_verified}")
        if step in self._rolled_back_at:
            raise SDCError(f"silent data corruption at {where} again after rolling back: a "
                           f"persistent fault; stopped")
        good = [path for saved, path in checkpoints.complete_checkpoints() if saved <= self.last_verified]
        if not good:
            raise SDCError(f"silent data corruption at {where}; no checkpoint at or before the last "
                           f"verified step {self.last_verified} to roll back to; stopped")
        self._rolled_back_at.add(step)
        self.rollbacks += 1
        if self.is_main:
            log.warning("silent data corruption at %s; rolling back to %s (rollback %d)", where,
                    good[-1], self.rollbacks)
        return good[-1]
