"""The numbers every process shares, read from the database when Prometheus scrapes: pending
approvals and their age, decisions and their latency, expiries, runs by status, live workers,
lease takeovers, and the notification outbox.

Read at scrape time rather than counted by a process, so any console process gives the same
answer and nothing is lost when a process restarts. Each family is one grouped query that an
index serves (approvals by status, events by kind, notifications by status); Prometheus sees
totals read from the tables as counters (they only fall when retention removes rows, which a
``rate()`` reads as a reset).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, DurationField, ExpressionWrapper, F, Min, Q, Sum
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from runtime.approvals.rules import DECIDED_STATUS, Decision
from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.meters import PREFIX
from runtime.models import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    Event,
    Notification,
    NotificationAttempt,
    NotificationStatus,
    Run,
    RunStatus,
    Worker,
)
from runtime.selectors.workers import worker_live
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


def _age(now: datetime, since: datetime | None) -> float:
    """Seconds from ``since`` to ``now``; 0 when there is nothing waiting."""
    return max(0.0, (now - since).total_seconds()) if since is not None else 0.0


def _by(rows: Mapping[str, float], labels: list[str]) -> Iterator[tuple[str, float]]:
    """Every label value, those with no row as 0: a series that vanishes cannot alert."""
    for label in labels:
        yield label, rows.get(label, 0)


class DatabaseCollector(Collector):
    """A prometheus_client collector that reads the shared numbers at each scrape."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock

    def describe(self) -> list[Metric]:
        """Nothing to check at registration (collect() would query the database)."""
        return []

    def collect(self) -> Iterator[Metric]:
        now = self.clock.now()
        yield from approval_metrics(now)
        yield from decision_metrics()
        yield run_metric()
        yield worker_metric(now)
        yield takeover_metric()
        yield from outbox_metrics(now)


def approval_metrics(now: datetime) -> Iterator[Metric]:
    """Pending approvals by kind, and how long the oldest of each kind has waited."""
    rows = (Approval.objects.filter(status=ApprovalStatus.PENDING).values("kind")
            .annotate(n=Count("pk"), oldest=Min("created_at")).order_by())
    kinds = [str(k) for k in ApprovalKind]
    counts = {r["kind"]: r["n"] for r in rows}
    oldest = {r["kind"]: _age(now, r["oldest"]) for r in rows}
    pending = GaugeMetricFamily(f"{PREFIX}approvals_pending",
                                "Approvals waiting for a person's decision, by kind.",
                                labels=["kind"])
    age = GaugeMetricFamily(f"{PREFIX}approval_oldest_pending_age_seconds",
                            "How long the oldest pending approval of each kind has waited "
                            "(0 when none waits).", labels=["kind"])
    for kind, n in _by(counts, kinds):
        pending.add_metric([kind], n)
    for kind, seconds in _by(oldest, kinds):
        age.add_metric([kind], seconds)
    yield pending
    yield age


@dataclass
class _Decided:
    """One decision's approvals: how many within each bucket's bound, in all, and the sum."""

    within: list[int] = field(default_factory=lambda: [0] * len(DECISION_BUCKETS))
    count: int = 0
    seconds: float = 0.0


def decision_metrics() -> Iterator[Metric]:
    """Decisions by decision with their latency (request to decision), and expiries by kind."""
    latency = ExpressionWrapper(F("decided_at") - F("created_at"), output_field=DurationField())
    within = {f"le{i}": Count("pk", filter=Q(latency__lte=timedelta(seconds=bound)))
              for i, bound in enumerate(DECISION_BUCKETS)}
    rows = (Approval.objects.filter(status__in=list(DECISION_OF_STATUS),
                                    decided_at__isnull=False)
            .alias(latency=latency).values("status")
            .annotate(n=Count("pk"), total=Sum("latency"), **within).order_by())
    decided = {str(d): _Decided() for d in Decision}
    for row in rows:
        into = decided[DECISION_OF_STATUS[row["status"]]]
        into.within = [a + row[f"le{i}"] for i, a in enumerate(into.within)]
        into.count += row["n"]
        into.seconds += row["total"].total_seconds() if row["total"] is not None else 0.0
    total = CounterMetricFamily(f"{PREFIX}approval_decisions",
                                "Approvals decided by a person, by decision (an approved one "
                                "stays counted once its call ran).", labels=["decision"])
    seconds = HistogramMetricFamily(f"{PREFIX}approval_decision_seconds",
                                    "Seconds from an approval's request to its decision.",
                                    labels=["decision"])
    for decision, d in decided.items():
        total.add_metric([decision], d.count)
        bounds = zip(DECISION_BUCKETS, d.within, strict=True)
        seconds.add_metric([decision], [*((floatToGoString(bound), n) for bound, n in bounds),
                                        ("+Inf", d.count)], d.seconds)
    yield total
    yield seconds
    expired = dict(Approval.objects.filter(status=ApprovalStatus.EXPIRED).values("kind")
                   .annotate(n=Count("pk")).order_by().values_list("kind", "n"))
    expiries = CounterMetricFamily(f"{PREFIX}approval_expiries",
                                   "Approvals that reached their deadline undecided, by kind.",
                                   labels=["kind"])
    for kind, n in _by(expired, [str(k) for k in ApprovalKind]):
        expiries.add_metric([kind], n)
    yield expiries


def run_metric() -> Metric:
    """Runs by status."""
    counts = dict(Run.objects.values("status").annotate(n=Count("pk")).order_by()
                  .values_list("status", "n"))
    runs = GaugeMetricFamily(f"{PREFIX}runs", "Runs by status.", labels=["status"])
    for status, n in _by(counts, [str(s) for s in RunStatus]):
        runs.add_metric([status], n)
    return runs


def worker_metric(now: datetime) -> Metric:
    """Live workers, by the rule the Workers page uses (a heartbeat within the worker's own
    lease)."""
    live = Worker.objects.alias(live=worker_live(now)).filter(live=True).count()
    return GaugeMetricFamily(f"{PREFIX}workers_live",
                             "Worker processes whose last heartbeat is within their lease.",
                             value=live)


def takeover_metric() -> Metric:
    """Lease takeovers recorded in the audit log (the events' (kind, at) index counts them)."""
    n = Event.objects.filter(kind=EventKind.LEASE_TAKEN_OVER).count()
    return CounterMetricFamily(f"{PREFIX}lease_takeovers",
                               "Runs taken over from an owner whose lease expired or who "
                               "was proved dead (lease.taken_over events).", value=n)


def outbox_metrics(now: datetime) -> Iterator[Metric]:
    """The notification outbox: its backlog, the oldest undelivered notification, failed
    attempts, and notifications given up on."""
    pending = Notification.objects.filter(status=NotificationStatus.PENDING).aggregate(
        n=Count("pk"), oldest=Min("created_at"))
    yield GaugeMetricFamily(f"{PREFIX}notifications_undelivered",
                            "Notifications not yet delivered and still being tried (the "
                            "outbox's backlog).", value=pending["n"])
    yield GaugeMetricFamily(f"{PREFIX}notification_oldest_undelivered_age_seconds",
                            "How long the oldest undelivered notification has waited (0 when "
                            "none waits).", value=_age(now, pending["oldest"]))
    yield CounterMetricFamily(f"{PREFIX}notification_attempts_failed",
                              "Delivery attempts that failed (each is retried with backoff "
                              "until the last).",
                              value=NotificationAttempt.objects.filter(ok=False).count())
    yield GaugeMetricFamily(f"{PREFIX}notifications_given_up",
                            "Notifications given up on after their last attempt.",
                            value=Notification.objects.filter(
                                status=NotificationStatus.FAILED).count())
