"""Injectable time, so lease logic is tested by moving a clock instead of sleeping."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    """This machine's clock in UTC: the time events are stamped with.

    Leases are not judged by it where the database has a clock of its own: ``database_time``
    tells the committers to compare and set lease expiries with PostgreSQL's
    ``clock_timestamp()`` inside the fencing statement, so workers on several machines agree
    on expiry however far their own clocks drift (design §6). On SQLite (one machine) the
    committer reads this clock inside the write transaction.
    """

    database_time = True

    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to; thread-safe. Leases are judged by it on every
    engine (its value is bound into the fencing statements), so tests move time by hand."""

    database_time = False

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> datetime:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now


SYSTEM_CLOCK = SystemClock()
