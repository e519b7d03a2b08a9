"""The runtime's entry points for callers: start a run, resume one, cancel one."""

from __future__ import annotations

from typing import Any

from runtime.agents.agent import get_agent
from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.errors import RunNotFound, RunNotResumable
from runtime.loop.driver import Driver
from runtime.models import (
    CANCELLABLE_RUN_STATUSES,
    Approval,
    ApprovalStatus,
    Run,
    RunStatus,
    Step,
    StepStatus,
)
from runtime.storage.base import Refused
from runtime.storage.engines import engine
from runtime.storage.events import log_events
from runtime.storage.plan import Fence, Plan, interrupt_step
from runtime.storage.runs import run_create


def start(agent_name: str, input: Any, created_by: str = "", *, clock: Clock = SYSTEM_CLOCK) -> Run:
    """Create a queued run (``run.created``). Unknown agent or bad input: error, nothing written."""
    get_agent(agent_name)
    return run_create(agent_name, input, created_by=created_by, now=clock.now())


def resume(run_id: int, owner: str | None = None, **driver_options: Any) -> Run:
    """Execute a run in this thread until it pauses or ends (claim, or take over if expired)."""

    return Driver(owner, **driver_options).drive(run_id)


def cancel(run_id: int, by: str, reason: str = "", *, clock: Clock = SYSTEM_CLOCK) -> Run:
    """Cancel a queued or waiting run; its open approvals are cancelled with it."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        raise RunNotFound(run_id)
    if run.status not in CANCELLABLE_RUN_STATUSES:
        raise RunNotResumable(run.pk, run.status)
    now = clock.now()
    plan = Plan(run_id=run.pk, at=now, actor=by, head=run.event_hash,
                fence=Fence(seq=run.event_seq, status=CANCELLABLE_RUN_STATUSES))
    for a in Approval.objects.filter(run_id=run.pk, status__in=[
            ApprovalStatus.PENDING, ApprovalStatus.APPROVED]).select_related("step"):
        plan.event("approval.cancelled", {"approval_id": a.pk, "reason": "run cancelled"},
                   a.step.index)
        plan.approval_move(a.pk, a.status, status=ApprovalStatus.CANCELLED, decided_by=by,
                           decided_at=now, note=reason)
    # A run handed back to the queue mid-decision has a step still deciding: it ends here.
    deciding = Step.objects.filter(run_id=run.pk, status=StepStatus.DECIDING).first()
    if deciding is not None:
        interrupt_step(plan, deciding, reason="run cancelled")
    plan.event("run.cancelled", {"by": by, "reason": reason})
    plan.run.update(status=RunStatus.CANCELLED, planned=[])
    try:
        committed = engine().commit(plan, clock)
    except Refused:
        raise RunNotResumable(run.pk, "changed while cancelling") from None
    log_events(committed.rows)
    run.refresh_from_db()
    return run
