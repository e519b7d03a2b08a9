"""What a SQLite worker process runs beside its runs: its WAL checkpoints on a thread of their
own (``checkpointer``), a watch on other processes' commits while it idles, and, when it stops,
its account of the single writer (``storage.base.WorkerStorage``)."""

from __future__ import annotations

from typing import cast

from django.db import DEFAULT_DB_ALIAS, connection, connections

from runtime.storage.faults import DATABASE_FAULTS
from runtime.storage.sqlite.base import DatabaseWrapper as QueuedSQLite
from runtime.storage.sqlite.base import writer_stats
from runtime.storage.sqlite.checkpointer import Checkpointer
from runtime.storage.sqlite.group import group_stats

WATCH_SECONDS = 0.05  # how often an idle worker looks for other connections' commits


def data_version() -> int:
    """SQLite's count of commits by other connections to this file."""
    with connection.cursor() as cursor:
        return int(cursor.execute("PRAGMA data_version").fetchone()[0])


class DataVersionWatch:
    """A commit by another connection shows in ``PRAGMA data_version``: looked at every
    ``WATCH_SECONDS`` while the worker wants news (a slot free, the last claim ran dry); a
    claim would cost the write lock."""

    poll_seconds = WATCH_SECONDS

    def __init__(self) -> None:
        self._seen: int | None = None

    def mark(self) -> None:
        self._seen = data_version()  # before the claim: a commit during it is news

    def fileno(self) -> int | None:
        return None

    def news(self, *, readable: bool, woken: bool, wanted: bool) -> bool:
        if woken or not wanted or self._seen is None:
            return False
        try:
            return data_version() != self._seen
        except DATABASE_FAULTS:
            return True  # the claim that follows meets the fault and backs off

    def close(self) -> None:
        """Nothing to close."""


class SqliteWorkerStorage:
    """A worker's checkpointer (on the runtime's backend, on a file) and its watch."""

    def __init__(self) -> None:
        db = connections[DEFAULT_DB_ALIAS]
        self.queued = isinstance(db, QueuedSQLite)
        self.checkpointer = (
            Checkpointer() if self.queued and not cast(QueuedSQLite, db).is_in_memory_db()
            else None)
        self.watch = DataVersionWatch()

    def start(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.start()

    def stop(self) -> str:
        checkpoints = ""
        if self.checkpointer is not None:
            self.checkpointer.stop()
            c = self.checkpointer.stats
            checkpoints = (f"; checkpoints: {c.checkpoints} ({c.restarts} with the WAL started "
                           f"over), the WAL at most {c.largest_wal} pages")
        return (writer_summary() if self.queued else "") + checkpoints


def writer_summary() -> str:
    """How this process used SQLite's single writer (with the runtime's backend)."""
    w = writer_stats()
    n = max(w.transactions, 1)
    g = group_stats()
    return (f"; write lock: {w.transactions} transactions, held {w.held:.3f} s "
            f"({w.held / n * 1000:.3f} ms each), waited {w.waited:.3f} s "
            f"({w.waited / n * 1000:.3f} ms each); group commits: {g.groups} carrying "
            f"{g.plans} plans (largest {g.largest})")
