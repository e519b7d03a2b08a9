"""The numbers every process shares, read from the database when Prometheus scrapes: pending
approvals and their age, decisions and their latency, expiries, runs by status, live workers,
lease takeovers, and the notification outbox.

Read at scrape time rather than counted by a process, so any console process gives the same
answer and nothing is lost when a process restarts. Each family is one grouped query that an
index serves (approvals by status, events by kind, notifications by status); Prometheus sees
totals read from the tables as counters: retention adds what it removes to the retired totals
(``runtime.retention.totals``), so they never fall.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime

from django.db.models import Count, Min
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

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
from runtime.retention.totals import (
    DECISION_BUCKETS,
    FAILED_ATTEMPTS,
    TAKEOVERS,
    decided,
    expiries,
    failed_attempts,
    retired,
    takeovers,
)
from runtime.selectors.workers import worker_live


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


def decision_metrics() -> Iterator[Metric]:
    """Decisions by decision with their latency (request to decision), and expiries by kind,
    each with what retention removed (``runtime.retention.totals``)."""
    gone = retired()
    total = CounterMetricFamily(f"{PREFIX}approval_decisions",
                                "Approvals decided by a person, by decision (an approved one "
                                "stays counted once its call ran).", labels=["decision"])
    seconds = HistogramMetricFamily(f"{PREFIX}approval_decision_seconds",
                                    "Seconds from an approval's request to its decision.",
                                    labels=["decision"])
    for decision, d in decided(Approval.objects.all()).items():
        count = d.count + gone.get(f"decisions:{decision}", 0)
        within = [n + gone.get(f"decision_le{i}:{decision}", 0) for i, n in enumerate(d.within)]
        total.add_metric([decision], count)
        bounds = zip(DECISION_BUCKETS, within, strict=True)
        seconds.add_metric([decision], [*((floatToGoString(bound), n) for bound, n in bounds),
                                        ("+Inf", count)],
                           d.seconds + gone.get(f"decision_seconds:{decision}", 0))
    yield total
    yield seconds
    expiries_metric = CounterMetricFamily(f"{PREFIX}approval_expiries",
                                          "Approvals that reached their deadline undecided, by "
                                          "kind.", labels=["kind"])
    for kind, n in expiries(Approval.objects.all()).items():
        expiries_metric.add_metric([kind], n + gone.get(f"expiries:{kind}", 0))
    yield expiries_metric


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
    n = takeovers(Event.objects.all()) + retired().get(TAKEOVERS, 0)
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
                              value=failed_attempts(NotificationAttempt.objects.all())
                              + retired().get(FAILED_ATTEMPTS, 0))
    yield GaugeMetricFamily(f"{PREFIX}notifications_given_up",
                            "Notifications given up on after their last attempt.",
                            value=Notification.objects.filter(
                                status=NotificationStatus.FAILED).count())
