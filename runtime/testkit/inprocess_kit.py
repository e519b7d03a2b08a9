"""The in-process kit: the same crash points without a subprocess, for fast tests of your own
agents. An armed point raises ``SimulatedCrash`` (a BaseException your tools cannot swallow);
the driver's heartbeat stops and its lease is abandoned, never released, as a dead process
leaves it. Time is a ``ManualClock``, so waiting out a lease costs nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from runtime import crashpoints
from runtime.clock import ManualClock
from runtime.errors import CrashNotReached, RunLeased, SimulatedCrash
from runtime.leasing.heartbeat import make_owner
from runtime.loop.control import resume, start
from runtime.models import Run, RunStatus
from runtime.testkit.base import Kit
from runtime.testkit.ledger import Ledger
from runtime.testkit.reached import Crash, Reached


class InProcessKit(Kit):
    """Crash, take over and decide in this process. ``ledger`` is your tools' outside record."""

    def __init__(self, ledger: Ledger | Path | str, *, lease_seconds: float = 1.0,
                 clock: ManualClock | None = None) -> None:
        self.ledger = ledger if isinstance(ledger, Ledger) else Ledger(ledger)
        self.lease_seconds = lease_seconds
        self.clock = clock or ManualClock(datetime.now(UTC))
        self.reached = Reached()

    def start(self, agent: str, input: Any = None, created_by: str = "kit") -> int:
        return start(agent, input, created_by, clock=self.clock).pk

    def crash(self, run_id: int, *crashes: Crash) -> SimulatedCrash:
        """Execute the run until one of ``crashes`` fires; the lease is left to expire. A run
        still held by a crashed owner needs ``expire()`` first, as a new process would."""
        for c in crashes:
            self.reached.expect(run_id, c)
        crashpoints.arm([c.arm() for c in crashes])
        try:
            self._drive(run_id, make_owner("kit-dead"))
        except SimulatedCrash as exc:
            self.reached.hit(exc.run_id, exc.point, exc.step_index)
            return exc
        finally:
            crashpoints.disarm()
        run = Run.objects.get(pk=run_id)
        raise CrashNotReached(str(crashes[0].point), run_id, crashes[0].step_index,
                              f"the run ended {run.status} without reaching it")

    def expire(self) -> None:
        """Move the clock past every lease this kit's drivers took."""
        self.clock.advance(self.lease_seconds + 0.001)

    def take_over(self, run_id: int) -> Run:
        """Prove a dead owner's live lease still holds, let it lapse, then resume as a new
        owner (a queued run is simply claimed)."""
        run = Run.objects.get(pk=run_id)
        if run.status == RunStatus.RUNNING:
            assert run.lease_expires_at is not None, "a running run holds a lease"
            if run.lease_expires_at > self.clock.now():
                try:
                    self._drive(run_id, make_owner("kit-early"))
                except RunLeased:
                    pass
                else:
                    raise AssertionError(f"run {run_id} was taken over before its lease expired")
                self.expire()
        return self._drive(run_id, make_owner("kit-heir"))

    def drain(self) -> list[Run]:
        """Take over or claim every run that is not waiting or finished, until none is left."""
        done: list[Run] = []
        while True:
            ids = list(Run.objects.filter(status__in=[RunStatus.QUEUED, RunStatus.RUNNING])
                       .order_by("pk").values_list("pk", flat=True))
            if not ids:
                return done
            for run_id in ids:
                done.append(self.take_over(run_id))

    def now(self) -> datetime:
        return self.clock.now()

    def _drive(self, run_id: int, owner: str) -> Run:
        return resume(run_id, owner=owner, clock=self.clock, lease_seconds=self.lease_seconds)
