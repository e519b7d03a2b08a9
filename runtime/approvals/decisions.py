"""Operators' decisions on approvals: approve one re-run, reject, or resolve with a result.

Each decision is one plan committed by the engine: a compare-and-set UPDATE from ``pending``
(so of two operators deciding at once exactly one wins), the run's compare-and-set on its chain
head while it waits, and the run's events.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from runtime.approvals.rules import (
    RESOLVABLE,
    approval_past_deadline,
    approval_request_intact,
    four_eyes_blocks,
)
from runtime.canonical import check_payload, request_digest
from runtime.clock import SYSTEM_CLOCK
from runtime.errors import ApprovalConflict, FourEyesViolation, InvalidDecision, InvalidPayload
from runtime.models import (
    Approval,
    ApprovalStatus,
    FailureCode,
    RunStatus,
    StepStatus,
)
from runtime.storage.base import Refused
from runtime.storage.engines import engine, notify_ready
from runtime.storage.events import log_events
from runtime.storage.plan import Fence, Plan


def approve(approval_id: int, by: str, note: str = "", *, now: datetime | None = None) -> Approval:
    """Authorize exactly one more start of the approved request; the run is queued."""
    return _decide(approval_id, by, note, ApprovalStatus.APPROVED, now=now)


def reject(approval_id: int, by: str, note: str, *, now: datetime | None = None) -> Approval:
    """End the run ``failed``/``rejected``; the tool is not called again."""
    if not note or not note.strip():
        raise InvalidDecision(approval_id, "a rejection needs a note saying why")
    return _decide(approval_id, by, note, ApprovalStatus.REJECTED, now=now)


def resolve(
    approval_id: int, by: str, result: Any, note: str = "", *, now: datetime | None = None
) -> Approval:
    """The operator checked the outside world: record ``result`` as the step's and continue."""
    try:
        data = check_payload("resolved result", result)
    except InvalidPayload as exc:
        raise InvalidDecision(approval_id, str(exc)) from None
    return _decide(approval_id, by, note, ApprovalStatus.RESOLVED, result=data, now=now)


def _decide(
    approval_id: int,
    by: str,
    note: str,
    status: str,
    *,
    result: Any = None,
    now: datetime | None = None,
) -> Approval:
    if not by:
        raise InvalidDecision(approval_id, "a decision needs the name of who made it")
    now = now or SYSTEM_CLOCK.now()
    try:
        approval = Approval.objects.select_related("run", "step").get(pk=approval_id)
    except (Approval.DoesNotExist, ValueError, TypeError):
        raise InvalidDecision(approval_id, "no such approval") from None
    if approval.status != ApprovalStatus.PENDING:
        raise _already_decided(approval)
    if approval_past_deadline(approval, now):
        raise _too_late(approval)
    if status == ApprovalStatus.RESOLVED and approval.kind not in RESOLVABLE:
        raise InvalidDecision(approval_id, "resolve applies to interrupted steps only; "
                              "a policy approval is approved or rejected")
    step, run = approval.step, approval.run
    if status != ApprovalStatus.REJECTED:
        if not approval_request_intact(approval):
            raise ApprovalConflict(approval_id, "its stored request does not match its digest, "
                                   "so what it shows is not what would run; it can only be "
                                   "rejected", status=approval.status,
                                   reason_code="stale")
        _check_four_eyes(approval, by)
    if approval.digest != request_digest(step.tool, step.arguments, step.effect):
        raise ApprovalConflict(approval_id, "stale: the step's request no longer matches "
                               "the request this approval was for", status=approval.status,
                               reason_code="stale")
    plan = Plan(run_id=run.pk, at=now, actor=by, head=run.event_hash,
                fence=Fence(seq=run.event_seq, status=(RunStatus.WAITING,)))
    plan.approval_move(approval.pk, ApprovalStatus.PENDING, open_at=now, status=status,
                       decided_by=by, decided_at=now, note=note, result=result)
    _effects(plan, approval, status, by, note, result)
    try:
        committed = engine().commit(plan, SYSTEM_CLOCK)
    except Refused:
        approval.refresh_from_db()
        if approval.status != ApprovalStatus.PENDING:
            raise _already_decided(approval) from None
        if approval_past_deadline(approval, now):
            raise _too_late(approval) from None
        raise ApprovalConflict(approval_id, "the run changed while deciding; try again",
                               status=approval.status, reason_code="retry") from None
    log_events(committed.rows)
    if plan.run.get("status") == RunStatus.QUEUED:
        notify_ready()
    approval.refresh_from_db()
    return approval


def _check_four_eyes(approval: Approval, by: str) -> None:
    if four_eyes_blocks(approval, by):
        raise FourEyesViolation(approval.pk, approval.run_id, by)


def _effects(plan: Plan, approval: Approval, status: str, by: str, note: str,
             result: Any) -> None:
    """What the decision does to the run and its step, added to ``plan``."""
    idx = approval.step.index
    base = {"approval_id": approval.pk, "kind": approval.kind, "decided_by": by, "note": note}
    if status == ApprovalStatus.APPROVED:
        plan.event("approval.granted", base, idx)
        plan.run["status"] = RunStatus.QUEUED
    elif status == ApprovalStatus.RESOLVED:
        plan.event("approval.resolved", {**base, "result": result}, idx)
        plan.event("step.tool_finished", {"result": result, "attempt": approval.step.attempt,
                                          "recovered_by": by}, idx)
        plan.step_update(approval.step, status=StepStatus.SUCCEEDED, result=result,
                         finished_at=plan.at)
        plan.run["status"] = RunStatus.QUEUED
    else:
        message = f"{by} rejected the call to {approval.tool} on step {idx}: {note}"
        plan.event("approval.rejected", base, idx)
        plan.event("run.failed", {"code": FailureCode.REJECTED.value, "message": message})
        plan.step_update(approval.step, status=StepStatus.REJECTED, finished_at=plan.at)
        plan.run.update(status=RunStatus.FAILED, failure_code=FailureCode.REJECTED,
                        failure_message=message, planned=[])


def _too_late(approval: Approval) -> ApprovalConflict:
    when = approval.expires_at.isoformat(timespec="seconds")
    return ApprovalConflict(approval.pk, f"already expired at {when}: too late to decide",
                            status=ApprovalStatus.EXPIRED, decided_at=approval.expires_at,
                            reason_code="expired")


def _already_decided(approval: Approval) -> ApprovalConflict:
    when = approval.decided_at.isoformat(timespec="seconds") if approval.decided_at else "?"
    who = approval.decided_by or "the runtime"
    return ApprovalConflict(
        approval.pk, f"already {approval.status} by {who} at {when}", status=approval.status,
        decided_by=approval.decided_by, decided_at=approval.decided_at)
