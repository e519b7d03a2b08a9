"""Named crash points in production code: no-ops unless the test kit arms them.

The driver calls ``reached(point, run_id=..., step_index=...)`` right after the commit that
holds the named event (or, for ``IN_TRANSACTION``, inside a state transaction before its
commit). The test kit arms points in-process (raise ``SimulatedCrash``) or in a worker
subprocess through the ``RUNTIME_CRASH_POINTS`` environment variable (SIGKILL itself).
"""

from __future__ import annotations

import json
import os
import signal
import threading
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from runtime.errors import SimulatedCrash


class CrashPoint(StrEnum):
    AFTER_STEP_STARTED = "after_step_started"
    AFTER_STEP_DECIDED = "after_step_decided"
    AFTER_TOOL_STARTED = "after_tool_started"
    AFTER_TOOL_EFFECT = "after_tool_effect"  # the tool returned; its result is not recorded
    AFTER_TOOL_FINISHED = "after_tool_finished"
    AFTER_RUN_RESUMED = "after_run_resumed"
    AFTER_STEP_INTERRUPTED = "after_step_interrupted"
    AFTER_PAUSE = "after_pause"
    DURING_LLM_REQUEST = "during_llm_request"
    AFTER_TOOL_DISPATCHED = "after_tool_dispatched"
    IN_TRANSACTION = "in_transaction"  # inside a state transaction, before its commit
    # The outbox (not a run's step): a notification sent, its attempt not yet recorded.
    AFTER_NOTIFICATION_SENT = "after_notification_sent"
    # A group commit of two or more plans, every plan applied, before its COMMIT (not a step's:
    # which runs share a group depends on timing).
    IN_GROUP_COMMIT = "in_group_commit"
    # A prune (runtime.retention): a batch's archive written and synced, its runs not yet
    # removed; and inside the batch's removal, every row deleted, before its COMMIT.
    AFTER_ARCHIVE_WRITTEN = "after_archive_written"
    IN_PRUNE_TRANSACTION = "in_prune_transaction"


# Points outside a run's steps: the crash matrix and the chaos soak's step points leave them out.
OFF_STEP_POINTS = frozenset({CrashPoint.AFTER_NOTIFICATION_SENT,
                             CrashPoint.IN_GROUP_COMMIT, CrashPoint.AFTER_ARCHIVE_WRITTEN,
                             CrashPoint.IN_PRUNE_TRANSACTION})


@dataclass
class Arm:
    """One armed crash: a point, optionally a step index and which occurrence (1 = first)."""

    point: CrashPoint
    step_index: int | None = None
    occurrence: int = 1
    seen: int = 0
    fired: bool = False

    def matches(self, point: CrashPoint, step_index: int | None) -> bool:
        if self.fired or point != self.point:
            return False
        if self.step_index is not None and step_index != self.step_index:
            return False
        self.seen += 1
        return self.seen == self.occurrence


@dataclass
class _Armed:
    arms: list[Arm] = field(default_factory=list)
    mode: str = "raise"  # "raise" (in-process) or "kill" (SIGKILL this process)
    reached_file: Path | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


_armed: _Armed | None = None


def arm(arms: list[Arm], *, mode: str = "raise", reached_file: Path | None = None) -> None:
    """Arm crash points for this process (the test kit's entry point)."""
    global _armed
    _armed = _Armed(arms=list(arms), mode=mode, reached_file=reached_file)


def disarm() -> None:
    global _armed
    _armed = None


def arm_from_env() -> None:
    """Arm from ``RUNTIME_CRASH_POINTS`` (JSON list of {point, step_index, occurrence})."""
    spec = os.environ.get("RUNTIME_CRASH_POINTS")
    if not spec:
        return
    arms = [
        Arm(CrashPoint(a["point"]), a.get("step_index"), int(a.get("occurrence", 1)))
        for a in json.loads(spec)
    ]
    reached = os.environ.get("RUNTIME_CRASH_REACHED_FILE")
    arm(arms, mode="kill", reached_file=Path(reached) if reached else None)


def reached(point: CrashPoint, *, run_id: int | None = None, step_index: int | None = None,
            detail: dict | None = None) -> None:
    """Mark that execution passed ``point``; crash here if the test kit armed it (``detail``
    goes into the reached file's record)."""
    armed = _armed
    if armed is None:
        return
    with armed.lock:
        hit = next((a for a in armed.arms if a.matches(point, step_index)), None)
        if hit is None:
            return
        hit.fired = True
        if armed.reached_file is not None:
            record = {"point": str(point), "run_id": run_id, "step_index": step_index,
                      **({"detail": detail} if detail else {})}
            with open(armed.reached_file, "a") as fh:
                fh.write(json.dumps(record) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
    if armed.mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise SimulatedCrash(str(point), run_id, step_index)


def is_armed() -> bool:
    return _armed is not None
