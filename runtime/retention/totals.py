"""Totals the metrics read from the tables (``runtime.metrics.collector``), and what removing
rows retires from them.

A total read at scrape time (lease takeovers, decisions and their latency, expiries, failed
deliveries) is what the rows say; removing rows (``prune``, notification retention) would make
it fall, which Prometheus takes for a counter reset and reads as a jump of the whole total.
So the rows' share of each total is computed here, by the same functions the metrics use, and
added to ``RetiredTotal`` in the transaction that removes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, QuerySet, Sum

from runtime.approvals.rules import DECIDED_STATUS, Decision
from runtime.models import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    Event,
    NotificationAttempt,
    RetiredTotal,
)
from runtime.storage.events import EventKind

# The decision each decided status records. An approved approval becomes ``consumed`` when
# its call runs (only approved ones are consumed), so it still counts as approved.
DECISION_OF_STATUS: dict[str, str] = {
    **{str(status): str(decision) for decision, status in DECIDED_STATUS.items()},
    ApprovalStatus.CONSUMED: Decision.APPROVE,
}

# Seconds from an approval's request to its decision: a person answers in minutes to days.
DECISION_BUCKETS = (10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 86400.0, 3 * 86400.0,
                    7 * 86400.0)

TAKEOVERS = "lease_takeovers"
FAILED_ATTEMPTS = "notification_attempts_failed"


@dataclass
class Decided:
    """One decision's approvals: how many within each bucket's bound, in all, and the sum."""

    within: list[float] = field(default_factory=lambda: [0.0] * len(DECISION_BUCKETS))
    count: float = 0
    seconds: float = 0.0


def decided(approvals: QuerySet[Approval]) -> dict[str, Decided]:
    """Decisions among ``approvals``, by decision, with their latency (request to decision)."""
    latency = ExpressionWrapper(F("decided_at") - F("created_at"), output_field=DurationField())
    within = {f"le{i}": Count("pk", filter=Q(latency__lte=timedelta(seconds=bound)))
              for i, bound in enumerate(DECISION_BUCKETS)}
    rows = (approvals.filter(status__in=list(DECISION_OF_STATUS), decided_at__isnull=False)
            .alias(latency=latency).values("status")
            .annotate(n=Count("pk"), total=Sum("latency"), **within).order_by())
    out = {str(d): Decided() for d in Decision}
    for row in rows:
        into = out[DECISION_OF_STATUS[row["status"]]]
        into.within = [a + row[f"le{i}"] for i, a in enumerate(into.within)]
        into.count += row["n"]
        into.seconds += row["total"].total_seconds() if row["total"] is not None else 0.0
    return out


def expiries(approvals: QuerySet[Approval]) -> dict[str, float]:
    """Approvals among ``approvals`` that reached their deadline undecided, by kind."""
    found = dict(approvals.filter(status=ApprovalStatus.EXPIRED).values("kind")
                 .annotate(n=Count("pk")).order_by().values_list("kind", "n"))
    return {str(k): float(found.get(str(k), 0)) for k in ApprovalKind}


def takeovers(events: QuerySet[Event]) -> int:
    """Lease takeovers among ``events`` (the events' (kind, at) index counts them)."""
    return events.filter(kind=EventKind.LEASE_TAKEN_OVER).count()


def failed_attempts(attempts: QuerySet[NotificationAttempt]) -> int:
    return attempts.filter(ok=False).count()


def totals(approvals: QuerySet[Approval], events: QuerySet[Event],
           attempts: QuerySet[NotificationAttempt]) -> dict[str, float]:
    """Every total these rows count toward, by name (what ``retired`` gives back)."""
    out: dict[str, float] = {TAKEOVERS: takeovers(events),
                             FAILED_ATTEMPTS: failed_attempts(attempts)}
    for decision, d in decided(approvals).items():
        out[f"decisions:{decision}"] = d.count
        out[f"decision_seconds:{decision}"] = d.seconds
        for i, n in enumerate(d.within):
            out[f"decision_le{i}:{decision}"] = n
    for kind, n in expiries(approvals).items():
        out[f"expiries:{kind}"] = n
    return out


def retire_in_tx(found: Mapping[str, float], using: str = "default") -> None:
    """Add ``found`` (``totals`` of rows about to be removed) to the retired totals, inside the
    transaction that removes them."""
    for name, value in found.items():
        if not value:
            continue
        rows = RetiredTotal.objects.using(using).filter(name=name)
        if rows.update(value=F("value") + value):
            continue
        try:
            with transaction.atomic(using=using):  # a savepoint: a racing first insert
                RetiredTotal.objects.using(using).create(name=name, value=value)
        except IntegrityError:
            rows.update(value=F("value") + value)


def retired(using: str = "default") -> dict[str, float]:
    """Every retired total by name (absent: nothing retired)."""
    return dict(RetiredTotal.objects.using(using).values_list("name", "value"))
