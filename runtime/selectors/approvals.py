"""Reads of approvals for people: the queue, one approval, and the decisions a person may make on
it."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet

from runtime.approvals.rules import (
    Decision,
    approval_edit_refusal,
    approval_edit_tool,
    approval_request_intact,
    approval_resolvable,
    decision_refusal,
    four_eyes_blocks,
)
from runtime.approvals.rules import approval_decisions as approval_decisions  # re-exported
from runtime.approvals.rules import approval_editable as approval_editable
from runtime.approvals.rules import approval_past_deadline as approval_past_deadline
from runtime.canonical import dumps
from runtime.conf import setting
from runtime.models import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    Effect,
    Event,
    Notification,
)


def pending(kind: str | None = None, agent: str | None = None) -> QuerySet[Approval]:
    """What waits for a person, oldest first, with its run and step (no N+1)."""
    qs = Approval.objects.filter(status=ApprovalStatus.PENDING).select_related("run", "step")
    if kind:
        qs = qs.filter(kind=kind)
    if agent:
        qs = qs.filter(run__agent=agent)
    return qs.order_by("created_at", "pk")


# The queue shows these columns of an approval, its run and its step; nothing else is loaded.
# ``status``, ``digest`` and the run's ``created_by`` let a row be put in a batch (the rules
# judge who may decide it, and the batch names the request shown by its digest).
QUEUE_FIELDS = ("id", "kind", "tool", "effect", "title", "created_at", "expires_at", "run_id",
                "step_id", "run__agent", "step__index", "status", "digest", "run__created_by")


# The queue's orders, by their ``?sort=`` value: oldest first (the default), or the approvals
# with a deadline first, soonest deadline first, then the others oldest first.
QUEUE_SORTS = ("", "expiring")


def approval_queue(kind: str | None = None, agent: str | None = None,
                   limit: int = 200, sort: str = "") -> tuple[list[Approval], bool]:
    """The first ``limit`` pending approvals in the ``sort`` order (and whether there are
    more), with only the columns the queue shows.

    Expiring first is two bounded reads, each in the order of an index: those with a
    deadline by deadline (``approval_status_expires``, which holds only them), then, if the
    page is not full, those without one oldest first (``approval_status_created``); one
    ordering with NULLs last would sort every pending approval."""
    if sort not in QUEUE_SORTS:
        raise ValueError(f"unknown queue order {sort!r}")
    qs = pending(kind, agent).only(*QUEUE_FIELDS)
    if sort == "expiring":
        rows = list(qs.filter(expires_at__isnull=False)
                    .order_by("expires_at", "created_at", "pk")[: limit + 1])
        if len(rows) <= limit:
            rows += list(qs.filter(expires_at__isnull=True)[: limit + 1 - len(rows)])
    else:
        rows = list(qs[: limit + 1])
    return rows[:limit], len(rows) > limit


def approval_batchable(approval: Approval, by: str, now: datetime | None = None) -> bool:
    """Whether ``by`` may put ``approval`` in a batch decision now: the rules let them at least
    end it (pending, within its deadline). Whether they may also allow it (four-eyes, an intact
    request) is judged per item when the batch is decided, and the refusal names it."""
    return decision_refusal(approval, Decision.REJECT, by, now) is None


# A deadline closer than this is shown emphasised, even when it is before any warning.
DEADLINE_NEAR = timedelta(hours=1)


def approval_deadline_urgency(approval: Approval, now: datetime) -> str:
    """How close ``approval``'s deadline is, for the queue to mark it: "urgent" once the
    channels' warning point is passed (``APPROVAL_WARN_BEFORE``), "near" within an hour,
    otherwise (or without a deadline) ""."""
    if approval.expires_at is None:
        return ""
    left = approval.expires_at - now
    if left <= timedelta(seconds=float(setting("APPROVAL_WARN_BEFORE") or 0)):
        return "urgent"
    return "near" if left <= DEADLINE_NEAR else ""


def approval_four_eyes_blocked(approval: Approval, by: str) -> bool:
    """Whether four-eyes bars ``by`` from allowing ``approval`` (they started its run)."""
    return four_eyes_blocks(approval, by)


def approvals_after(after: tuple[datetime, int] | None, limit: int) -> tuple[list[Approval], bool]:
    """Pending approvals in the queue's order (oldest first) after the keyset ``after``
    (created_at, id), at most ``limit`` of them, and whether there are more. Keyset, not
    offset: a page deep in a long queue costs what the first does, and an approval decided
    meanwhile shifts nothing."""
    qs = pending()
    if after is not None:
        created, pk = after
        qs = qs.filter(Q(created_at__gt=created) | Q(created_at=created, pk__gt=pk))
    rows = list(qs[: limit + 1])
    return rows[:limit], len(rows) > limit


def approval_queue_version(kind: str | None = None, agent: str | None = None) -> str:
    """Changes whenever the queue's membership does (one approval added, one decided): a poll
    that sends the version it has gets nothing back while it holds."""
    qs = pending(kind, agent).order_by()
    newest = qs.order_by("-pk").values_list("pk", flat=True).first()
    return f"{qs.count()}.{newest or 0}"


def approval_for_page(pk: int) -> Approval | None:
    """One approval with its run and step (a single query)."""
    return Approval.objects.select_related("run", "step").filter(pk=pk).first()


def approval_version(approval: Approval) -> str:
    """Changes whenever anything shown about the approval can: its status, or anything in its
    run (every change to a run appends to its audit chain)."""
    return f"{approval.status}.{approval.run.event_seq}"


def approval_tampered(approval: Approval) -> bool:
    """Whether the request shown is not the one the approval's digest names."""
    return not approval_request_intact(approval)


def approval_outcome_unknown(approval: Approval) -> bool:
    """Whether the request is a side effect that may already have happened: the person must
    check the outside world first. (A policy approval is asked before the call ever runs.)"""
    return approval_resolvable(approval) and approval.effect == Effect.SIDE_EFFECT


def approval_after_restore(approval: Approval) -> bool:
    """Whether the question is one a restore raised: the run may have made the call (or later
    ones) after the backup's moment, whether or not the call had started before it."""
    return approval.kind == ApprovalKind.RESTORED


def approval_is_policy(approval: Approval) -> bool:
    """A policy approval asks before a first call; the others ask about an interrupted one."""
    return approval.kind == ApprovalKind.POLICY


def approval_effect_source(approval: Approval) -> str:
    """Where the request's effect came from, when the tool did not declare it in code (a
    Pydantic AI tool's metadata, an MCP server's annotations, the operator's setting); ""
    for a native tool."""
    payload = (Event.objects.filter(run_id=approval.run_id, step_index=approval.step.index,
                                    kind="step.decided")
               .order_by("-seq").values_list("payload", flat=True).first())
    return str((payload or {}).get("effect_source") or "")


def approval_notifications(approval: Approval) -> list[Any]:
    """Who was told about the approval, on which channel, and how delivery went (oldest
    first; one row per channel and event)."""

    return list(Notification.objects.filter(approval_id=approval.pk).order_by("pk").only(
        "event", "channel", "kind", "target", "status", "attempts", "created_at",
        "delivered_at", "last_error", "next_attempt_at"))


def approval_edit_schema(approval: Approval) -> dict[str, Any] | None:
    """The JSON schema of the arguments of ``approval``'s tool, which an edit must pass (a
    form is built from it), or None when its request may not be edited."""
    tool, _why = approval_edit_tool(approval)
    return None if tool is None else tool.json_schema()


def approval_edit_note(approval: Approval) -> str:
    """Why ``approval``'s request may not be edited before it is allowed (its page says so
    for a pending policy approval); "" when it may."""
    return approval_edit_refusal(approval)


def approval_edit(approval: Approval) -> dict[str, Any] | None:
    """What a person changed of an allowed policy call: who, the proposed and the effective
    request and digests, and each top-level field that differs (``was``/``now`` say whether
    it was there before and after); None when nobody edited it."""
    if not approval.edited_by:
        return None
    proposed = approval.arguments if isinstance(approval.arguments, dict) else {}
    effective = (approval.effective_arguments
                 if isinstance(approval.effective_arguments, dict) else {})
    changes = []
    for name in sorted(proposed.keys() | effective.keys()):
        if name in proposed and name in effective and (
                dumps(proposed[name]) == dumps(effective[name])):
            continue
        changes.append({"field": name, "was": name in proposed, "from": proposed.get(name),
                        "now": name in effective, "to": effective.get(name)})
    return {"by": approval.edited_by, "proposed": approval.arguments,
            "effective": approval.effective_arguments, "proposed_digest": approval.digest,
            "effective_digest": approval.effective_digest, "changes": changes}
