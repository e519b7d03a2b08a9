"""Operators' decisions on approvals: approve one re-run, reject, or resolve with a result; a
policy approval may be allowed with arguments a person edited (``arguments=``).

Each decision is one plan committed by the engine: a compare-and-set UPDATE from ``pending``
(so of two operators deciding at once exactly one wins), the run's compare-and-set on its chain
head while it waits, and the run's events.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from runtime.approvals.rules import (
    DECIDED_STATUS,
    Decision,
    already_decided,
    approval_edit_tool,
    approval_past_deadline,
    decision_refusal,
    too_late,
)
from runtime.canonical import check_payload, dumps, request_digest
from runtime.clock import SYSTEM_CLOCK
from runtime.errors import (
    ApprovalConflict,
    InvalidArguments,
    InvalidDecision,
    InvalidEdit,
    InvalidPayload,
)
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
    return approval_decide(approval_id, Decision.APPROVE, by, note, now=now)


def reject(approval_id: int, by: str, note: str, *, now: datetime | None = None) -> Approval:
    """End the run ``failed``/``rejected``; the tool is not called again."""
    return approval_decide(approval_id, Decision.REJECT, by, note, now=now)


def resolve(
    approval_id: int, by: str, result: Any, note: str = "", *, now: datetime | None = None
) -> Approval:
    """The operator checked the outside world: record ``result`` as the step's and continue."""
    return approval_decide(approval_id, Decision.RESOLVE, by, note, result=result, now=now)


# A waiting run's chain moves without its approval changing only for a note beside it (a
# deadline warning, an escalation): the decision is planned again on the new head, its rules
# and digest checked afresh, rather than told to try again.
DECIDE_ATTEMPTS = 3


def approval_decide(approval_id: int, decision: Decision | str, by: str, note: str = "", *,
                    result: Any = None, arguments: dict[str, Any] | None = None,
                    now: datetime | None = None) -> Approval:
    """Make ``decision`` on the approval as ``by`` (the console's pages and the JSON API both
    decide through here). Refused with the typed error ``rules.decision_refusal`` names, or
    ``InvalidDecision`` for a bad input (no name, a rejection without a note, a result that
    cannot be stored), changing nothing; ``ApprovalConflict`` if someone decided first.
    ``arguments``: allow a policy approval's call with these arguments instead of the ones
    proposed (``InvalidEdit``, naming the fields, when the request may not be edited or the
    tool's schema refuses them)."""
    decision, note, result = decision_inputs(approval_id, decision, by, note, result)
    arguments = edit_inputs(approval_id, decision, arguments)
    now = now or SYSTEM_CLOCK.now()
    for attempt in range(1, DECIDE_ATTEMPTS + 1):
        approval = approval_load(approval_id)
        plan = decision_plan(approval, decision, by, note, result, now, arguments=arguments)
        try:
            committed = engine().commit(plan, SYSTEM_CLOCK)
            break
        except Refused:
            lost = decision_lost(approval, now)
            if lost.reason_code != "retry" or attempt == DECIDE_ATTEMPTS:
                raise lost from None
    log_events(committed.rows)
    if plan.run.get("status") == RunStatus.QUEUED:
        notify_ready()
    approval.refresh_from_db()
    return approval


def decision_inputs(approval_id: int, decision: Decision | str, by: str, note: str,
                    result: Any) -> tuple[Decision, str, Any]:
    """The decision, note and result checked as inputs (before any row is read):
    ``InvalidDecision`` names what is wrong."""
    try:
        decision = Decision(decision)
    except ValueError:
        raise InvalidDecision(approval_id, f"unknown decision {decision!r}; one of "
                              f"{', '.join(Decision)}") from None
    if decision == Decision.REJECT and (not note or not note.strip()):
        raise InvalidDecision(approval_id, "a rejection needs a note saying why")
    if decision == Decision.RESOLVE:
        try:
            result = check_payload("resolved result", result)
        except InvalidPayload as exc:
            raise InvalidDecision(approval_id, str(exc)) from None
    else:
        result = None
    if not by:
        raise InvalidDecision(approval_id, "a decision needs the name of who made it")
    return decision, note, result


def edit_inputs(approval_id: int, decision: Decision, arguments: Any) -> dict[str, Any] | None:
    """Edited arguments checked as an input: only to approve, a JSON object within the
    payload limits (``InvalidEdit``); None when there is no edit."""
    if arguments is None:
        return None
    if decision != Decision.APPROVE:
        raise InvalidEdit(approval_id, "edited arguments go with an approval only")
    if not isinstance(arguments, dict):
        raise InvalidEdit(approval_id, "the edited arguments must be a JSON object")
    try:
        checked: dict[str, Any] = check_payload("edited arguments", arguments)
    except InvalidPayload as exc:
        raise InvalidEdit(approval_id, str(exc)) from None
    return checked


def approval_load(approval_id: int) -> Approval:
    """The approval with its run and step, or ``InvalidDecision`` ("no such approval")."""
    try:
        return Approval.objects.select_related("run", "step").get(pk=approval_id)
    except (Approval.DoesNotExist, ValueError, TypeError):
        raise InvalidDecision(approval_id, "no such approval") from None


def decision_plan(approval: Approval, decision: Decision, by: str, note: str, result: Any,
                  now: datetime, *, arguments: dict[str, Any] | None = None) -> Plan:
    """The one commit ``decision`` is: the approval's compare-and-set from ``pending``, the
    run's fence while it waits, and the run's events; with edited ``arguments`` (checked by
    ``edit_inputs``), also the step's request replaced by them. Raises the refusal the rules
    name (nothing is built for a decision that may not be made)."""
    refusal = decision_refusal(approval, decision, by, now)
    if refusal is not None:
        raise refusal
    if arguments is not None:
        arguments = _checked_edit(approval, arguments)
    step, run = approval.step, approval.run
    # The step moved on from the request this approval holds (a concurrent change): stale.
    if approval.digest != request_digest(step.tool, step.arguments, step.effect):
        raise ApprovalConflict(approval.pk, "stale: the step's request no longer matches "
                               "the request this approval was for", status=approval.status,
                               reason_code="stale")
    status = DECIDED_STATUS[decision]
    plan = Plan(run_id=run.pk, at=now, actor=by, head=run.event_hash,
                fence=Fence(seq=run.event_seq, status=(RunStatus.WAITING,)))
    edit: dict[str, Any] = {}
    if arguments is not None:
        edit = dict(effective_arguments=arguments, edited_by=by,
                    effective_digest=request_digest(step.tool, arguments, step.effect))
    plan.approval_move(approval.pk, ApprovalStatus.PENDING, open_at=now, status=status,
                       decided_by=by, decided_at=now, note=note, result=result, **edit)
    if edit:
        _edited(plan, approval, by, arguments or {}, edit["effective_digest"])
    _effects(plan, approval, status, by, note, result, edit.get("effective_digest", ""))
    return plan


def _checked_edit(approval: Approval, arguments: dict[str, Any]) -> dict[str, Any] | None:
    """The edited arguments if they change the request, None if they equal the proposed
    ones (a plain allow); ``InvalidEdit`` when the request may not be edited, or the tool's
    own schema refuses them (naming each field)."""
    tool, why = approval_edit_tool(approval)
    if tool is None:
        raise InvalidEdit(approval.pk, why)
    try:
        tool.validate(arguments)
    except InvalidArguments as exc:
        raise InvalidEdit(approval.pk, f"the tool's schema refuses the edited arguments: "
                          f"{exc.errors}", exc.fields) from None
    same = (request_digest(approval.tool, arguments, approval.effect)
            == request_digest(approval.tool, approval.arguments, approval.effect))
    return None if same else arguments


def _edited(plan: Plan, approval: Approval, by: str, arguments: dict[str, Any],
            digest: str) -> None:
    """The step's request becomes the edited one, and the audit says who changed what."""
    proposed = approval.arguments if isinstance(approval.arguments, dict) else {}
    changes = []
    for name in sorted(proposed.keys() | arguments.keys()):
        if name in proposed and name in arguments and (
                dumps(proposed[name]) == dumps(arguments[name])):
            continue
        change: dict[str, Any] = {"field": name}
        if name in proposed:
            change["from"] = proposed[name]
        if name in arguments:
            change["to"] = arguments[name]
        changes.append(change)
    plan.event("approval.edited", {
        "approval_id": approval.pk, "edited_by": by, "proposed_digest": approval.digest,
        "effective_digest": digest, "changes": changes, "arguments": arguments},
        approval.step.index)
    plan.step_update(approval.step, arguments=arguments)


def decision_lost(approval: Approval, now: datetime) -> ApprovalConflict:
    """Why a decision's commit was refused, read afresh: someone (or the deadline) decided
    first, or the run moved while deciding."""
    approval.refresh_from_db()
    if approval.status != ApprovalStatus.PENDING:
        return already_decided(approval)
    if approval_past_deadline(approval, now):
        return too_late(approval)
    return ApprovalConflict(approval.pk, "the run changed while deciding; try again",
                            status=approval.status, reason_code="retry")


def _effects(plan: Plan, approval: Approval, status: str, by: str, note: str,
             result: Any, effective_digest: str = "") -> None:
    """What the decision does to the run and its step, added to ``plan``."""
    idx = approval.step.index
    base = {"approval_id": approval.pk, "kind": approval.kind, "decided_by": by, "note": note}
    if status == ApprovalStatus.APPROVED:
        plan.event("approval.granted", {**base, "effective_digest": effective_digest}
                   if effective_digest else base, idx)
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
