"""A worker's WAL checkpoints, on a thread of their own instead of inside a commit.

SQLite checkpoints the WAL into the database file automatically when a commit leaves it past
1,000 pages, and does it inside that commit, while the committing writer still holds the write
lock: every thousand pages one step paid for copying them all (a p99 commit of 2 ms, a worst of
23 ms). A worker turns that off for its own connections and checkpoints from this thread
instead: ``PRAGMA wal_checkpoint(PASSIVE)`` copies what no reader still needs without taking
the write lock, so writers go on meanwhile. The WAL starts over from its beginning only when a
writer finds it wholly copied, which a stream of writers never lets happen; so once it holds
``RESTART_PAGES``, the checkpointer copies the few pages written since its last pass while
holding the writer queue (no writer between), and the next writer starts the WAL over: the
bulk of the copying stays outside the lock and the WAL stays bounded. Other processes (the
console, ``runagent``) keep SQLite's automatic checkpoint.

A pass that finds new pages syncs twice (the WAL, then the database file), so passes are paced
by this process's own commits: one once ``PASS_COMMITS`` write transactions have come since the
last, or ``PASS_SECONDS`` after it if any have. A busy worker still checkpoints every tick; a
worker with one slow run in flight no longer pays two syncs a tick for a page or two (a step
cost 5.3 syncs instead of 2 when every tick synced).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import cast

from django.db import connection

from runtime.storage.faults import DATABASE_FAULTS
from runtime.storage.sqlite.base import DatabaseWrapper as QueuedSQLite
from runtime.storage.sqlite.base import set_autocheckpoint, writer_stats

log = logging.getLogger("runtime.checkpointer")

INTERVAL_SECONDS = 0.1
RESTART_PAGES = 1_000  # SQLite's own automatic checkpoint threshold
PASS_COMMITS = 64  # write transactions since the last pass that make the next one due
PASS_SECONDS = 2.0  # ...or this long since it, with at least one


@dataclass
class CheckpointStats:
    checkpoints: int = 0
    pages: int = 0  # pages copied into the database file
    largest_wal: int = 0  # the most pages the WAL held at a checkpoint
    restarts: int = 0  # passes finished holding the writer queue, so the WAL starts over


class Checkpointer:
    """Checkpoints this process's SQLite database every ``interval`` seconds until stopped."""

    def __init__(self, interval: float = INTERVAL_SECONDS) -> None:
        self.interval = interval
        self.stats = CheckpointStats()
        self._stop = threading.Event()
        self._seen = writer_stats().transactions  # this process's commits at the last pass
        self._last = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="checkpointer")

    def start(self) -> None:
        set_autocheckpoint(0)  # this process's connections opened from now on leave it to us
        if connection.connection is not None:  # and the one this thread already has
            connection.connection.execute("PRAGMA wal_autocheckpoint = 0")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        set_autocheckpoint(None)

    def tick(self) -> tuple[int, int, int]:
        """One passive checkpoint, and its tail under the writer queue once the WAL holds
        ``RESTART_PAGES``: (busy, pages in the WAL, pages checkpointed) of the first."""
        busy, wal, done = self._passive()
        self.stats.largest_wal = max(self.stats.largest_wal, wal)
        if wal >= RESTART_PAGES:
            # Started only on the runtime's backend (storage.sqlite.background).
            with cast(QueuedSQLite, connection).writer_queue_held():
                self._passive()
            self.stats.restarts += 1
        return busy, wal, done

    def due(self, now: float | None = None) -> bool:
        """Whether this process has committed enough since the last pass to pay its syncs.
        Without the writer queue commits are not counted: every tick is due, as before."""
        if not connection.settings_dict["OPTIONS"].get("writer_queue", True):
            return True
        new = writer_stats().transactions - self._seen
        if new <= 0:
            return False
        now = time.monotonic() if now is None else now
        return new >= PASS_COMMITS or now - self._last >= PASS_SECONDS

    def _passive(self) -> tuple[int, int, int]:
        with connection.cursor() as cursor:
            busy, wal, done = cursor.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        self.stats.checkpoints += 1
        self.stats.pages += max(done, 0)
        return busy, wal, done

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                if not self.due():
                    continue
                self._seen, self._last = writer_stats().transactions, time.monotonic()
                try:
                    self.tick()
                except DATABASE_FAULTS as exc:  # the next tick tries again
                    log.warning("checkpoint failed: %s", " ".join(str(exc).split())[:300])
                    connection.close()
        finally:
            connection.close()
