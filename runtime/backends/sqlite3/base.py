"""SQLite with writers queued by the kernel instead of SQLite's busy handler.

SQLite lets one writer in at a time; a connection that finds the write lock taken sleeps in its
busy handler for 1, 2, 5, 10, ... ms before trying again, so two busy processes spend much of
their time asleep while the lock is free. Here every write transaction first takes an exclusive
``flock`` on ``<database>.writer`` (one open file per connection): a waiting writer blocks in
the kernel and wakes the moment the holder commits or rolls back. SQLite's own locking still
decides; the flock only orders the queue. A process that dies holding it releases it with its
files. Writes outside a transaction (autocommit) do not queue; SQLite's busy timeout covers them.

The process keeps count of its write transactions, the time they waited for the lock and the
time they held it (``writer_stats``), so a worker can say how much of the single writer it used.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.backends.sqlite3.base import DatabaseWrapper as SQLiteWrapper


@dataclass
class WriterStats:
    """This process's write transactions since it started: how many, waiting, holding."""

    transactions: int = 0
    waited: float = 0.0  # seconds spent queued for the lock
    held: float = 0.0  # seconds between taking the lock and the end of the commit or rollback
    since: float = 0.0  # time.monotonic() when counting began


_stats = WriterStats(since=time.monotonic())
_stats_lock = threading.Lock()


def writer_stats() -> WriterStats:
    """A copy of this process's counts."""
    with _stats_lock:
        return WriterStats(_stats.transactions, _stats.waited, _stats.held, _stats.since)


class DatabaseWrapper(SQLiteWrapper):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._writer_fd: int | None = None
        self._writer_since: float | None = None  # when this connection took the lock

    def _writer_lock(self) -> None:
        if self.is_in_memory_db():
            return
        if self._writer_fd is None:
            path = f"{self.settings_dict['NAME']}.writer"
            self._writer_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        asked = time.perf_counter()
        fcntl.flock(self._writer_fd, fcntl.LOCK_EX)
        self._writer_since = now = time.perf_counter()
        with _stats_lock:
            _stats.waited += now - asked

    def _writer_unlock(self) -> None:
        if self._writer_since is None:
            return
        held, self._writer_since = time.perf_counter() - self._writer_since, None
        fcntl.flock(self._writer_fd, fcntl.LOCK_UN)
        with _stats_lock:
            _stats.transactions += 1
            _stats.held += held

    @contextmanager
    def write_transaction(self) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on any exception), queued like
        every write transaction, without ``atomic()``'s bookkeeping around it: the runtime's
        loop commits twice a step and that bookkeeping cost a tenth of a step's CPU.

        Outside atomic blocks only. What runs inside may use the ORM's queries, inserts and
        updates (they join this transaction) but not ``atomic()`` or ``on_commit()``.
        """
        if self.in_atomic_block:
            raise transaction.TransactionManagementError(
                "write_transaction() cannot run inside an atomic block")
        self.ensure_connection()
        self._start_transaction_under_autocommit()
        try:
            yield
        except BaseException:
            self._rollback()
            raise
        try:
            self._commit()
        except BaseException:
            self._rollback()  # a failed COMMIT leaves the transaction open: end it
            raise

    def _start_transaction_under_autocommit(self) -> None:
        self._writer_lock()
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._writer_unlock()
            raise

    def _commit(self) -> None:
        try:
            super()._commit()
        finally:
            self._writer_unlock()

    def _rollback(self) -> None:
        try:
            super()._rollback()
        finally:
            self._writer_unlock()

    def _close(self) -> None:
        try:
            super()._close()
        finally:
            self._writer_unlock()
            if self._writer_fd is not None:
                os.close(self._writer_fd)
                self._writer_fd = None
