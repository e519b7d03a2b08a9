"""Approvals past their deadline: ended expired, and their runs failed."""

from __future__ import annotations

from datetime import datetime

from runtime.canonical import iso_time
from runtime.clock import SYSTEM_CLOCK
from runtime.models import (
    Approval,
    ApprovalStatus,
    FailureCode,
    RunStatus,
    StepStatus,
)
from runtime.storage.base import Refused
from runtime.storage.engines import engine
from runtime.storage.events import log_events
from runtime.storage.plan import Fence, Plan


def approvals_expire(now: datetime, *, limit: int = 100) -> list[int]:
    """End every pending approval whose deadline has passed: ``approval.expired``, the run
    fails ``approval_expired``, the tool is not called. Each is the same compare-and-set from
    ``pending`` a decision makes, so of an expiry and a decision exactly one wins. Returns the
    ids this call expired."""
    due = list(Approval.objects.filter(status=ApprovalStatus.PENDING, expires_at__lte=now)
               .select_related("run", "step").order_by("expires_at")[:limit])
    expired = []
    for approval in due:
        run, step = approval.run, approval.step
        assert approval.expires_at is not None, "selected by expires_at <= now"
        plan = Plan(run_id=run.pk, at=now, actor="system", head=run.event_hash,
                    fence=Fence(seq=run.event_seq, status=(RunStatus.WAITING,)))
        plan.approval_move(approval.pk, ApprovalStatus.PENDING, expired_by=now,
                           status=ApprovalStatus.EXPIRED, decided_at=now)
        when = approval.expires_at.isoformat(timespec="seconds")
        message = (f"nobody decided on the call to {approval.tool} on step {step.index} "
                   f"before its deadline ({when})")
        plan.event("approval.expired", {"approval_id": approval.pk, "kind": approval.kind,
                                        "expires_at": iso_time(approval.expires_at),
                                        "message": message},
                   step.index)
        plan.event("run.failed", {"code": FailureCode.APPROVAL_EXPIRED.value,
                                  "message": message})
        if step.status == StepStatus.WAITING:  # a policy question: the call never started
            plan.step_update(step, status=StepStatus.FAILED, error=message, finished_at=now)
        plan.run.update(status=RunStatus.FAILED, failure_code=FailureCode.APPROVAL_EXPIRED,
                        failure_message=message, planned=[])
        try:
            committed = engine().commit(plan, SYSTEM_CLOCK)
        except Refused:
            continue  # decided, cancelled or expired by someone else first
        log_events(committed.rows)
        expired.append(approval.pk)
    return expired
