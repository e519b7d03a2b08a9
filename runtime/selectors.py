"""Reads for people: what the console (or any other reader) shows, with the runtime's rules
applied here, once, so a page never restates which decisions are allowed or whether a lease
holds.

Each selector loads only the columns its readers show and is bounded: a run of 5,000 steps
or an audit log of a million events costs a page the same as a short one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Q, Value
from django.db.models.lookups import GreaterThan

from .approvals import RESOLVABLE, approval_request_intact, four_eyes_blocks, pending
from .approvals import approval_past_deadline as past_deadline
from .clock import SYSTEM_CLOCK
from .models import (
    TERMINAL_RUN_STATUSES,
    Approval,
    ApprovalKind,
    ApprovalStatus,
    Effect,
    Event,
    Run,
    Step,
    Worker,
)
from .store import lease_expired

# The queue shows these columns of an approval, its run and its step; nothing else is loaded.
QUEUE_FIELDS = ("id", "kind", "tool", "effect", "title", "created_at", "expires_at", "run_id",
                "step_id", "run__agent", "step__index")
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


def events_after(run_id: int, after_seq: int, limit: int) -> tuple[list[Event], bool]:
    """A run's events after sequence number ``after_seq``, in order, at most ``limit`` of
    them, and whether there are more (keyset on the unique (run, seq) index)."""
    rows = list(Event.objects.filter(run_id=run_id, seq__gt=after_seq)
                .order_by("seq")[: limit + 1])
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


def approval_past_deadline(approval: Approval, now: datetime | None = None) -> bool:
    """Whether a pending approval's deadline has passed: the runtime refuses any decision on
    it as too late, and its next expiry sweep ends it ``expired``."""
    return past_deadline(approval, now or SYSTEM_CLOCK.now())


def approval_decisions(approval: Approval, by: str, now: datetime | None = None) -> list[str]:
    """The decisions ``by`` may make on ``approval`` now, in the order to offer them: none once
    decided or past its deadline; only rejecting under four-eyes or when the stored request
    does not match its digest; resolving only where a call may have happened."""
    if approval.status != ApprovalStatus.PENDING or approval_past_deadline(approval, now):
        return []
    if four_eyes_blocks(approval, by) or not approval_request_intact(approval):
        return ["reject"]
    if approval.kind in RESOLVABLE:
        return ["approve", "resolve", "reject"]
    return ["approve", "reject"]


def approval_tampered(approval: Approval) -> bool:
    """Whether the request shown is not the one the approval's digest names."""
    return not approval_request_intact(approval)


def approval_outcome_unknown(approval: Approval) -> bool:
    """Whether the request is a side effect that may already have happened: the person must
    check the outside world first. (A policy approval is asked before the call ever runs.)"""
    return approval.kind in RESOLVABLE and approval.effect == Effect.SIDE_EFFECT


def approval_is_policy(approval: Approval) -> bool:
    """A policy approval asks before a first call; the others ask about an interrupted one."""
    return approval.kind == ApprovalKind.POLICY


@dataclass(frozen=True)
class Tail:
    """The latest rows of a long list, and how to reach the ones before them."""

    rows: list[Any]
    total: int
    earlier: int | None  # the key to ask for the rows before these, None if these are the first


def steps_tail(run_id: int, *, upto: int | None = None, before: int | None = None,
               limit: int = 50) -> Tail:
    """The last ``limit`` steps of a run (up to step ``upto``, or before step ``before``), in
    order. Steps are numbered 1, 2, 3… without gaps, so the last index is the total."""
    qs = Step.objects.filter(run_id=run_id)
    if upto is not None:
        qs = qs.filter(index__lte=upto)
    if before is not None:
        qs = qs.filter(index__lt=before)
    rows = list(qs.order_by("-index")[:limit])[::-1]
    last = Step.objects.filter(run_id=run_id).order_by("-index").values_list(
        "index", flat=True).first()
    return Tail(rows, last or 0, rows[0].index if rows and rows[0].index > 1 else None)


def events_tail(run: Run, *, limit: int = 50) -> Tail:
    """The last ``limit`` events of a run, in order; the chain head gives the total."""
    rows = list(Event.objects.filter(run_id=run.pk).order_by("-seq")[:limit])[::-1]
    return Tail(rows, run.event_seq, rows[0].seq if rows and rows[0].seq > 1 else None)


def run_for_page(pk: int) -> Run | None:
    """One run, with whether its lease holds by the database's clock (the rule claims use)."""
    return Run.objects.annotate(lease_gone=lease_expired(SYSTEM_CLOCK)).filter(pk=pk).first()


def run_lease_live(run: Run) -> bool:
    """Whether someone holds the run's lease right now (a run from ``run_for_page``)."""
    return bool(run.lease_owner) and not run.lease_gone


def run_is_live(run: Run) -> bool:
    """Whether the run can still change (so a page showing it should keep looking)."""
    return run.status not in TERMINAL_RUN_STATUSES


def run_version(run: Run) -> str:
    """Changes whenever the run does: every change appends to its audit chain."""
    return str(run.event_seq)


def run_approvals(run_id: int, limit: int = 50) -> list[Approval]:
    """A run's latest ``limit`` approvals, oldest first, with the step index each is about."""
    qs = (Approval.objects.filter(run_id=run_id).select_related("step")
          .only("id", "kind", "status", "tool", "decided_by", "decided_at", "created_at",
                "consumed_at", "expires_at", "run_id", "step__index")
          .order_by("-created_at", "-pk"))
    return list(qs[:limit])[::-1]


def worker_live(now: datetime) -> GreaterThan:
    """A worker is live while its last heartbeat is younger than its own lease: as a query
    expression, so the database tells live from dead without loading every row."""
    age = ExpressionWrapper(Value(now, output_field=DateTimeField()) - F("heartbeat_at"),
                            output_field=DurationField())
    lease = ExpressionWrapper(F("lease_seconds") * Value(timedelta(seconds=1)),
                              output_field=DurationField())
    return GreaterThan(lease, age)


def live_workers(now: datetime) -> list[str]:
    """The owners of the live workers, sorted."""
    return sorted(Worker.objects.alias(live=worker_live(now)).filter(live=True)
                  .values_list("owner", flat=True))


def approval_notifications(approval: Approval) -> list[Any]:
    """Who was told about the approval, on which channel, and how delivery went (oldest
    first; one row per channel and event)."""
    from .models import Notification

    return list(Notification.objects.filter(approval_id=approval.pk).order_by("pk").only(
        "event", "channel", "kind", "target", "status", "attempts", "created_at",
        "delivered_at", "last_error", "next_attempt_at"))
