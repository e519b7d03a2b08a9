"""The runtime's entry points for callers: start a run, resume one, cancel one."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from .agents import get_agent
from .audit import EventSpec
from .clock import SYSTEM_CLOCK, Clock
from .errors import RunNotFound, RunNotResumable
from .models import Approval, ApprovalStatus, Run, RunStatus, Step, StepStatus
from .store import run_append_in_tx, run_create


def start(agent_name: str, input: Any, created_by: str = "", *, clock: Clock = SYSTEM_CLOCK) -> Run:
    """Create a queued run (``run.created``). Unknown agent or bad input: error, nothing written."""
    get_agent(agent_name)
    return run_create(agent_name, input, created_by=created_by, now=clock.now())


def resume(run_id: int, owner: str | None = None, **driver_options: Any) -> Run:
    """Execute a run in this thread until it pauses or ends (claim, or take over if expired)."""
    from .driver import Driver

    return Driver(owner, **driver_options).drive(run_id)


def cancel(run_id: int, by: str, reason: str = "", *, clock: Clock = SYSTEM_CLOCK) -> Run:
    """Cancel a queued or waiting run; its open approvals are cancelled with it."""
    now = clock.now()
    with transaction.atomic():
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            raise RunNotFound(run_id)
        if run.status not in (RunStatus.QUEUED, RunStatus.WAITING):
            raise RunNotResumable(run.pk, run.status)
        open_approvals = list(Approval.objects.filter(
            run_id=run.pk, status__in=[ApprovalStatus.PENDING, ApprovalStatus.APPROVED]))
        specs = [EventSpec("approval.cancelled", {"approval_id": a.pk, "reason": "run cancelled"},
                           a.step.index) for a in open_approvals]
        # A run handed back to the queue mid-decision has a step still deciding: it ends here.
        deciding = Step.objects.filter(run_id=run.pk, status=StepStatus.DECIDING).first()
        if deciding is not None:
            specs.append(EventSpec("step.interrupted", {"was": "deciding", "reason":
                                                        "run cancelled"}, deciding.index))
        specs.append(EventSpec("run.cancelled", {"by": by, "reason": reason}))
        if run_append_in_tx(run, specs, actor=by, now=now,
                            expect_status=[RunStatus.QUEUED, RunStatus.WAITING],
                            run_fields={"status": RunStatus.CANCELLED, "planned": []}) is None:
            raise RunNotResumable(run.pk, "changed while cancelling")
        if deciding is not None:
            Step.objects.filter(pk=deciding.pk, status=StepStatus.DECIDING).update(
                status=StepStatus.INTERRUPTED)
        Approval.objects.filter(pk__in=[a.pk for a in open_approvals]).update(
            status=ApprovalStatus.CANCELLED, decided_by=by, decided_at=now, note=reason)
    run.refresh_from_db()
    return run
