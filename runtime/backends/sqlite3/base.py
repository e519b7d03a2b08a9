"""SQLite with writers queued by the kernel instead of SQLite's busy handler.

SQLite lets one writer in at a time; a connection that finds the write lock taken sleeps in its
busy handler for 1, 2, 5, 10, ... ms before trying again, so two busy processes spend much of
their time asleep while the lock is free. Here every write transaction first takes an exclusive
``flock`` on ``<database>.writer`` (one open file per connection): a waiting writer blocks in
the kernel and wakes the moment the holder commits. SQLite's own locking still decides; the
flock only orders the queue. A process that dies holding it releases it with its files.
"""

from __future__ import annotations

import fcntl
import os
from typing import Any

from django.db.backends.sqlite3.base import DatabaseWrapper as SQLiteWrapper


class DatabaseWrapper(SQLiteWrapper):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._writer_fd: int | None = None
        self._writer_held = False

    def _writer_lock(self) -> None:
        if self.is_in_memory_db():
            return
        if self._writer_fd is None:
            path = f"{self.settings_dict['NAME']}.writer"
            self._writer_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._writer_fd, fcntl.LOCK_EX)
        self._writer_held = True

    def _writer_unlock(self) -> None:
        if self._writer_held:
            self._writer_held = False
            fcntl.flock(self._writer_fd, fcntl.LOCK_UN)

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
