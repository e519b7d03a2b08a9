"""Reads of worker processes for people: which are live, and which agents they run."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Value
from django.db.models.lookups import GreaterThan

from runtime.models import (
    Worker,
)


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


def agents_without_live_worker(agents: Iterable[str], now: datetime) -> set[str]:
    """Those of ``agents`` that no live worker has: a worker claims runs of its own agents
    only (``Worker.agents``), so their runs wait until a worker that has them starts. One
    query, and none when ``agents`` is empty."""
    wanted = set(agents)
    if not wanted:
        return set()
    had = (Worker.objects.alias(live=worker_live(now)).filter(live=True)
           .values_list("agents", flat=True))
    return wanted.difference(*(set(listed or ()) for listed in had))
