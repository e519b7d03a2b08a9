"""Before an approval's deadline: a warning, then an escalation, each once.

Nobody deciding in time ends an approval ``expired`` (``runtime.approvals.expiry``). Before
that, at ``RUNTIME["APPROVAL_WARN_BEFORE"]`` seconds before the deadline, the channels told of
the request are warned (notification ``approval.expiring``); at
``RUNTIME["APPROVAL_ESCALATE_BEFORE"]`` seconds before it, the channels that ask for
``approval.escalated`` (a second channel, or an email group) are told. An approval decided
before a point is not told of it; one created already past a point is told at the next sweep.

Each is one transaction: the approval's compare-and-set (``warned_at``/``escalated_at`` from
null, row count checked: of many workers sweeping at once exactly one writes it), the
notifications (``approval_deadline_near``'s receivers: the outbox, connected when the app is
ready, so this package needs no import of it), and the run's audit event
(``approval.warned``/``approval.escalated``) fenced on the waiting run's chain head.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.dispatch import Signal

from runtime.canonical import iso_time
from runtime.clock import SYSTEM_CLOCK
from runtime.conf import deadline_problem, setting
from runtime.models import Approval, ApprovalStatus, RunStatus
from runtime.storage.base import Committed, Refused
from runtime.storage.engines import engine
from runtime.storage.events import log_events
from runtime.storage.plan import Fence, Plan

# Sent inside the transaction that marks an approval warned or escalated. Keyword arguments:
# ``approval_id``, ``event`` (the notification's: ``approval.expiring`` or
# ``approval.escalated``), ``at``. A receiver returns how many notifications it wrote; one
# that raises fails the transaction (nothing is marked, the next sweep tries again).
approval_deadline_near = Signal()


@dataclass(frozen=True)
class Point:
    """A moment before the deadline: the setting that places it, the approval's column that
    records it was reached, and what it writes."""

    setting: str
    column: str
    kind: str  # the audit event
    event: str  # the notification event


WARNING = Point("APPROVAL_WARN_BEFORE", "warned_at", "approval.warned", "approval.expiring")
ESCALATION = Point("APPROVAL_ESCALATE_BEFORE", "escalated_at", "approval.escalated",
                   "approval.escalated")


def deadline_seconds(point: Point) -> float:
    """How many seconds before the deadline ``point`` is (0: never); ``ImproperlyConfigured``
    when the settings do not fit together (``manage.py check`` reports the same)."""
    problem = deadline_problem({k: setting(k) for k in (WARNING.setting, ESCALATION.setting)})
    if problem:
        raise ImproperlyConfigured(problem)
    return float(setting(point.setting) or 0)


def approvals_warn(now: datetime, *, limit: int = 100) -> list[int]:
    """Warn of every pending approval whose warning point has passed and whose deadline has
    not: once each. Returns the ids this call warned."""
    return _sweep(WARNING, now, limit)


def approvals_escalate(now: datetime, *, limit: int = 100) -> list[int]:
    """Escalate every pending approval whose escalation point has passed and whose deadline
    has not: once each. Returns the ids this call escalated."""
    return _sweep(ESCALATION, now, limit)


def approvals_near_deadline(now: datetime) -> tuple[list[int], list[int]]:
    """The worker's sweep: warnings first, then escalations (an approval past both points is
    warned, then escalated, in this one call)."""
    return approvals_warn(now), approvals_escalate(now)


def _sweep(point: Point, now: datetime, limit: int) -> list[int]:
    seconds = deadline_seconds(point)
    if seconds <= 0:
        return []
    due = list(Approval.objects.filter(
        status=ApprovalStatus.PENDING, expires_at__gt=now,
        expires_at__lte=now + timedelta(seconds=seconds), **{f"{point.column}__isnull": True})
        .select_related("run", "step").order_by("expires_at")[:limit])
    done = []
    for approval in due:
        try:
            committed = _reach(point, approval, now)
        except Refused:
            continue  # the run moved (a decision, a cancellation): the next sweep reads again
        if committed is not None:
            log_events(committed.rows)
            done.append(approval.pk)
    return done


def _reach(point: Point, approval: Approval, now: datetime) -> Committed | None:
    """One approval's warning or escalation, all in one transaction; None if another sweep
    (or a decision) got there first."""
    run, step = approval.run, approval.step
    assert approval.expires_at is not None, "selected by expires_at > now"
    with transaction.atomic():
        moved = Approval.objects.filter(
            pk=approval.pk, status=ApprovalStatus.PENDING, expires_at__gt=now,
            **{f"{point.column}__isnull": True}).update(**{point.column: now})
        if moved != 1:
            return None
        told = _notify(point, approval.pk, now)
        plan = Plan(run_id=run.pk, at=now, actor="system", head=run.event_hash,
                    fence=Fence(seq=run.event_seq, status=(RunStatus.WAITING,)))
        left = max(0, int((approval.expires_at - now).total_seconds()))
        plan.event(point.kind, {"approval_id": approval.pk, "kind": approval.kind,
                                "expires_at": iso_time(approval.expires_at),
                                "seconds_left": left, "notifications": told}, step.index)
        return engine().apply_in_tx(plan, SYSTEM_CLOCK)


def _notify(point: Point, approval_id: int, now: datetime) -> int:
    answers: list[tuple[Any, Any]] = approval_deadline_near.send(
        Point, approval_id=approval_id, event=point.event, at=now)
    return sum(n for _receiver, n in answers if isinstance(n, int))
