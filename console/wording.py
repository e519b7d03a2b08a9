"""The words the console uses for each kind of approval.

A policy approval asks before a call ever runs: it is allowed or denied. An interrupted side
effect (or a reconcile conflict) asks about a call that may already have happened: it is run
once more, recorded as having happened, or the run ends. Buttons, confirmations, outcomes and
409 messages all take their words from here, so one kind is never worded as the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from runtime.approvals.rules import Decision
from runtime.models import Approval, ApprovalKind, ApprovalStatus, Effect, Run
from runtime.selectors import approval_is_policy

# Keyed by the choices, looked up by the stored strings (equal to them).
KIND_WORDS: dict[str, str] = {
    ApprovalKind.POLICY: "policy check",
    ApprovalKind.INTERRUPTED_SIDE_EFFECT: "interrupted call",
    ApprovalKind.RECONCILE: "reconcile conflict",
    ApprovalKind.RESTORED: "restored from a backup",
}


@dataclass(frozen=True)
class Choice:
    """One decision as a person sees it: the heading that opens it, what ticking the box
    confirms, and the button."""

    summary: str
    confirm: str
    button: str


POLICY_CHOICES = {
    Decision.APPROVE: Choice("Allow this call", "Yes: allow this call, once, with these arguments.",
                      "Allow"),
    Decision.REJECT: Choice("Deny", "Yes: deny this call and end the run.", "Deny"),
}
RERUN_CHOICES = {
    Decision.APPROVE: Choice("Run it once more", "Yes: run this exact request once more.",
                      "Run it once more"),
    Decision.RESOLVE: Choice("It happened: record the result",
                      "Yes: it happened; record this result and continue.", "Record the result"),
    Decision.REJECT: Choice("End the run", "Yes: end the run; do not call the tool again.",
                     "End the run"),
}

_POLICY_STATUS: dict[str, str] = {
    ApprovalStatus.PENDING: "waiting for a decision",
    ApprovalStatus.APPROVED: "allowed, not started yet",
    ApprovalStatus.CONSUMED: "allowed, started",
    ApprovalStatus.REJECTED: "denied",
    ApprovalStatus.CANCELLED: "cancelled",
    ApprovalStatus.EXPIRED: "expired",
}
_RERUN_STATUS: dict[str, str] = {
    ApprovalStatus.PENDING: "waiting for a decision",
    ApprovalStatus.APPROVED: "approved to run once more, not started yet",
    ApprovalStatus.CONSUMED: "approved, run once more",
    ApprovalStatus.RESOLVED: "recorded as happened",
    ApprovalStatus.REJECTED: "run ended",
    ApprovalStatus.CANCELLED: "cancelled",
    ApprovalStatus.EXPIRED: "expired",
}


def choices(approval: Approval) -> dict[Decision, Choice]:
    return POLICY_CHOICES if approval_is_policy(approval) else RERUN_CHOICES


def kind_word(kind: str) -> str:
    return KIND_WORDS.get(kind, kind)


def effect_word(approval: Approval) -> str:
    """What the approval's call does, in words: whether it changes the world, and whether it
    may already have done so (an interrupted call) or has not run (a policy check)."""
    changes = approval.effect == Effect.SIDE_EFFECT
    if approval_is_policy(approval):
        return "changes things outside; not run yet" if changes else "only reads; not run yet"
    return "changes things outside; may already have happened" if changes else "only reads"


def batch_buttons(approvals: list[Approval]) -> dict[str, str]:
    """The queue's batch buttons in the words of the kinds on offer: "Allow" for policy
    checks, "Run it once more" for interrupted calls, both when both are listed; ending them
    is "Deny" or "End the runs"."""
    policy = any(approval_is_policy(a) for a in approvals)
    rerun = any(not approval_is_policy(a) for a in approvals)
    approve = [POLICY_CHOICES[Decision.APPROVE].button] if policy or not rerun else []
    reject = [POLICY_CHOICES[Decision.REJECT].button] if policy or not rerun else []
    if rerun:
        approve.append(RERUN_CHOICES[Decision.APPROVE].button)
        reject.append("End the runs")
    return {Decision.APPROVE: " / ".join(approve), Decision.REJECT: " / ".join(reject)}


def status_word(approval: Approval, status: str | None = None, *, when: bool = True) -> str:
    """``approval``'s status (or ``status``) in words, with when the call started if it did:
    "allowed, started at 2026-12-03 20:11:08 UTC" rather than "consumed"."""
    status = status or approval.status
    table = _POLICY_STATUS if approval_is_policy(approval) else _RERUN_STATUS
    word = table.get(status, status)
    if when and status == ApprovalStatus.CONSUMED and approval.consumed_at:
        word += f" at {_utc(approval.consumed_at)}"
    return word


def failure_words(run: Run, approvals: Iterable[Approval]) -> str:
    """Why ``run`` failed. When a person's decision ended it, the approval's own words ("denied
    by ada: too large" for a policy check, "run ended by ada: …" for an interrupted call),
    not the stored message's "ada rejected"; otherwise the runtime's message."""
    if run.failure_code == "rejected":
        ended = [a for a in approvals if a.status == ApprovalStatus.REJECTED]
        if ended:
            last = max(ended, key=lambda a: a.pk)
            words = f"{status_word(last)} by {last.decided_by or 'the runtime'}"
            return f"{words}: {last.note}" if last.note else words
    return run.failure_message


def what_happens_next(approval: Approval) -> str:
    """After a decision: what the runtime does about it, in the approval's own terms."""
    tool, index = approval.tool, approval.step.index
    policy = approval_is_policy(approval)
    started = f" at {_utc(approval.consumed_at)}" if approval.consumed_at else ""
    if approval.status == ApprovalStatus.APPROVED:
        return (f"The run is queued. The next worker to claim it calls {tool} on step {index}."
                if policy else
                f"The run is queued. The next worker to claim it runs {tool} once more, on step "
                f"{index} with the same idempotency key. If that process dies too, a new "
                "approval is needed.")
    if approval.status == ApprovalStatus.CONSUMED:
        return (f"The allowed call to {tool} started{started}." if policy else
                f"{tool} was run once more{started}.")
    if approval.status == ApprovalStatus.RESOLVED:
        return (f"Step {index} was recorded as succeeded with the given result; {tool} is not "
                "called again. The run continues from the next step.")
    if approval.status == ApprovalStatus.REJECTED:
        return (f"The run ended failed; {tool} was never called." if policy else
                f"The run ended failed; {tool} will not be called again.")
    if approval.status == ApprovalStatus.CANCELLED:
        return "Nothing will run: this approval was cancelled."
    if approval.status == ApprovalStatus.EXPIRED:
        return (f"Nobody decided before the deadline: the run ended failed (approval_expired) "
                f"and {tool} was never called." if policy else
                f"Nobody decided before the deadline: the run ended failed (approval_expired) "
                f"and {tool} will not be called again.")
    return ""


def utc(moment: datetime) -> str:
    """A moment in words, to the second: "2026-12-03 20:11:08 UTC"."""
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"


_utc = utc
