"""What both crash kits share: the outside world's ledger, the crash bookkeeping, the operator
and the invariant check."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from typing import Any

from runtime.clock import SYSTEM_CLOCK
from runtime.models import Approval
from runtime.schedules.changes import schedule_authorize, schedule_create
from runtime.schedules.firing import schedules_fire_due
from runtime.testkit.invariants import Report, check_invariants
from runtime.testkit.ledger import Ledger
from runtime.testkit.operator import Decision, decide, operate
from runtime.testkit.reached import Reached


class Kit:
    ledger: Ledger
    reached: Reached
    _schedules = 0

    def start(self, agent: str, input: Any = None, created_by: str = "kit") -> int:
        raise NotImplementedError

    def agents_registered(self) -> AbstractContextManager:
        """The kit's agents, registered for work done in this process."""
        return nullcontext()

    def start_scheduled(self, agent: str, input: Any = None, by: str = "kit") -> int:
        """Queue a run as an occurrence of a schedule whose standing authorization ``by`` set
        before it fired (design §10), and return its id. Each call makes its own hourly
        schedule, created an hour ago so it is due now: the run stays within its period for
        the whole of a test."""

        with self.agents_registered():
            earlier = (self.now() or SYSTEM_CLOCK.now()) - timedelta(hours=1)
            Kit._schedules += 1
            schedule = schedule_create(f"kit-{os.getpid()}-{Kit._schedules}", agent, input,
                                       by=by, now=earlier, interval_seconds=3600)
            schedule_authorize(schedule.pk, True, by=by, now=earlier)
            assert schedule.next_fire_at is not None, "schedule_create sets it"
            (run_id,) = schedules_fire_due(schedule.next_fire_at, only=[schedule.pk])
            return run_id

    def decide(self, approval_id: int, decision: Decision, by: str = "kit-operator") -> Approval:
        """Play the operator on one approval (in this process, through the runtime's API)."""
        return decide(approval_id, decision, by)

    def operate(self, choose: Callable[[Approval], Decision | None],
                by: str = "kit-operator") -> list[tuple[Approval, Decision]]:
        """Decide every pending approval with ``choose`` (None leaves it pending)."""
        return operate(choose, by)

    def check(self, runs: Iterable[int] | None = None) -> Report:
        """All six invariants, counting side effects from this kit's ledger."""
        return check_invariants(executions=self.ledger.executions(), reached=self.reached,
                                runs=runs, now=self.now())

    def now(self) -> datetime | None:
        """The time leases are judged by (None: the wall clock)."""
        return None
