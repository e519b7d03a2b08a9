"""The rules of deciding, written once: which decisions exist, which apply to an approval, and who
may make them. The console offers, the JSON API lists and accepts, and the runtime
(``runtime.approvals.decisions``) carries out exactly what ``decision_refusal`` allows
(``approval_decisions`` lists it)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from runtime.agents.agent import registry
from runtime.agents.tools import Tool
from runtime.canonical import request_digest
from runtime.clock import SYSTEM_CLOCK
from runtime.conf import setting
from runtime.effects import Effect
from runtime.errors import (
    AgentRuntimeError,
    ApprovalConflict,
    FourEyesViolation,
    InvalidDecision,
    UnknownAgent,
)
from runtime.models import Approval, ApprovalKind, ApprovalStatus


class Decision(StrEnum):
    """What a person may decide on an approval (design §8), in the order they are offered."""

    APPROVE = "approve"  # run the same request once more
    RESOLVE = "resolve"  # it happened: record the result the person found, and go on
    REJECT = "reject"  # end the run; the tool is not called again


# The status a decision moves its approval to.
DECIDED_STATUS = {Decision.APPROVE: ApprovalStatus.APPROVED,
                  Decision.RESOLVE: ApprovalStatus.RESOLVED,
                  Decision.REJECT: ApprovalStatus.REJECTED}

# Approvals about a call that may already have happened: a person may resolve them with what
# they found. A policy approval asks before a first call: it is approved or rejected.
RESOLVABLE_KINDS = (ApprovalKind.INTERRUPTED_SIDE_EFFECT, ApprovalKind.RECONCILE,
                    ApprovalKind.RESTORED)


def approval_resolvable(approval: Approval) -> bool:
    """Whether ``approval`` may be resolved with a result (its call may have happened)."""
    return approval.kind in RESOLVABLE_KINDS


def approval_request_intact(approval: Approval) -> bool:
    """Whether the request an approval holds (and a page shows) is the one its digest names.
    If someone edited the stored arguments, a person would decide on one request while the
    digest, and the step it is checked against, let another one run."""
    return approval.digest == request_digest(approval.tool, approval.arguments, approval.effect)


def four_eyes() -> bool:
    """Whether the person who started a run is barred from letting its side effects through."""
    return bool(setting("FOUR_EYES"))


def four_eyes_blocks(approval: Approval, by: str) -> bool:
    """True when four-eyes bars ``by`` from approving or resolving ``approval`` (rejecting
    stays open to everyone: stopping a run is always safe)."""
    return (four_eyes() and approval.effect == Effect.SIDE_EFFECT
            and bool(approval.run.created_by) and approval.run.created_by == by)


def approval_past_deadline(approval: Approval, now: datetime | None = None) -> bool:
    """Whether ``approval`` waits past its deadline (by ``now``, else the system clock): every
    decision on it is refused as too late, and the next expiry sweep ends it ``expired``."""
    return (approval.status == ApprovalStatus.PENDING and approval.expires_at is not None
            and approval.expires_at <= (now or SYSTEM_CLOCK.now()))


def decision_refusal(approval: Approval, decision: Decision, by: str,
                     now: datetime | None = None) -> AgentRuntimeError | None:
    """Why ``by`` may not make ``decision`` on ``approval`` now, as the typed error the runtime
    raises for it, or None when it may: nothing once decided or past its deadline; resolving
    only where the call may have happened; only rejecting when the stored request does not
    match its digest, or under four-eyes for the person who started the run."""
    if approval.status != ApprovalStatus.PENDING:
        return already_decided(approval)
    if approval_past_deadline(approval, now):
        return too_late(approval)
    if decision == Decision.RESOLVE and not approval_resolvable(approval):
        return InvalidDecision(approval.pk, "resolve applies to interrupted steps only; a "
                               "policy approval is approved or rejected")
    if decision != Decision.REJECT:
        if not approval_request_intact(approval):
            return ApprovalConflict(approval.pk, "its stored request does not match its "
                                    "digest, so what it shows is not what would run; it can "
                                    "only be rejected", status=approval.status,
                                    reason_code="stale")
        if four_eyes_blocks(approval, by):
            return FourEyesViolation(approval.pk, approval.run_id, by)
    return None


def approval_decisions(approval: Approval, by: str,
                      now: datetime | None = None) -> list[Decision]:
    """The decisions ``by`` may make on ``approval`` now, in the order to offer them."""
    return [d for d in Decision if decision_refusal(approval, d, by, now) is None]


def already_decided(approval: Approval) -> ApprovalConflict:
    """The answer to a decision on an approval someone (or its deadline) decided first."""
    when = approval.decided_at.isoformat(timespec="seconds") if approval.decided_at else "?"
    who = approval.decided_by or "the runtime"
    return ApprovalConflict(
        approval.pk, f"already {approval.status} by {who} at {when}", status=approval.status,
        decided_by=approval.decided_by, decided_at=approval.decided_at)


def too_late(approval: Approval) -> ApprovalConflict:
    """The answer to a decision on an approval past its deadline."""
    assert approval.expires_at is not None
    when = approval.expires_at.isoformat(timespec="seconds")
    return ApprovalConflict(approval.pk, f"already expired at {when}: too late to decide",
                            status=ApprovalStatus.EXPIRED, decided_at=approval.expires_at,
                            reason_code="expired")


def approval_edit_tool(approval: Approval) -> tuple[Tool | None, str]:
    """The tool whose own schema checks edited arguments for ``approval``'s request, or None
    and why its request may not be edited: only a policy approval's call has not run (an
    interrupted one may have happened as proposed); the agent and the tool must allow it and
    still be registered here, since their schema is what checks the edit."""
    if approval.kind != ApprovalKind.POLICY:
        return None, ("only a policy approval's request can be edited: this call may already "
                      "have happened as proposed")
    try:
        agent = registry.get(approval.run.agent)
    except UnknownAgent:
        return None, (f"agent {approval.run.agent!r} is not configured here, so its tool's "
                      "schema cannot check an edit")
    if not agent.editable:
        return None, f"agent {agent.name!r} does not allow its calls to be edited"
    tool = agent.tool_for_step(approval.step)
    if tool is None:
        return None, f"tool {approval.tool!r} is no longer registered for agent {agent.name!r}"
    if not tool.editable:
        return None, f"tool {tool.name!r} does not allow its arguments to be edited"
    return tool, ""


def approval_edit_refusal(approval: Approval) -> str:
    """Why ``approval``'s request may not be edited before it is allowed; "" when it may."""
    return approval_edit_tool(approval)[1]


def approval_editable(approval: Approval, by: str, now: datetime | None = None) -> bool:
    """Whether ``by`` may edit ``approval``'s request and allow it now: the request may be
    edited, and ``by`` may approve it."""
    return (not approval_edit_refusal(approval)
            and decision_refusal(approval, Decision.APPROVE, by, now) is None)
