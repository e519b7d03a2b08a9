"""Injectable time, so lease logic is tested by moving a clock instead of sleeping."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    """The time leases are judged by: this machine's clock in UTC on SQLite (one machine), the
    database server's clock on PostgreSQL, so workers on several machines agree on expiry
    however far their own clocks drift (design §6)."""

    def now(self) -> datetime:
        from django.db import connection  # per thread: the heartbeat asks on its own

        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT clock_timestamp()")
                return cursor.fetchone()[0].astimezone(UTC)
        return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to; thread-safe."""

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
