"""Giving the SQLite file's free pages back to the file system after a prune (``--vacuum``).

Deleted rows leave free pages inside the file; SQLite reuses them for new rows but never
shrinks the file on its own unless ``auto_vacuum`` is on, and that mode can only be set on an
empty database or by a full ``VACUUM``. So the first reclaim sets ``auto_vacuum=INCREMENTAL``
and runs ``VACUUM``: it rewrites the whole file, needs free disk space of about the file's size,
and holds the write lock throughout (writers queue, and past ``RUNTIME_SQLITE_TIMEOUT`` they
get "database is locked" and back off). Every later reclaim is ``PRAGMA incremental_vacuum``
in steps of ``STEP_PAGES``, each a short write, so workers get in between. Then a
``wal_checkpoint(TRUNCATE)`` lets the file (and its WAL) shrink. On PostgreSQL, autovacuum
makes deleted rows' space reusable; ``VACUUM FULL`` or pg_repack give it back to the OS (the
docs say how).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from django.db import connections

from runtime.errors import PruneRefused
from runtime.host.files import database_path
from runtime.storage.sqlite.base import DatabaseWrapper as QueuedSQLite

STEP_PAGES = 2048  # 8 MB of 4 KB pages per step of an incremental reclaim
_INCREMENTAL = 2  # PRAGMA auto_vacuum's value for INCREMENTAL


@dataclass(frozen=True)
class Reclaimed:
    """The file's size (with its WAL) before and after, and how it was reclaimed."""

    before: int
    after: int
    mode: str  # "vacuum" (the first, full rewrite) or "incremental"
    checkpointed: bool  # False: a reader kept the WAL; the file shrinks at a later checkpoint


def sqlite_reclaim(using: str = "default") -> Reclaimed:
    """Reclaim the free pages of this SQLite database (see the module's docstring)."""
    connection = connections[using]
    if connection.vendor != "sqlite":
        raise PruneRefused("reclaiming free pages is for SQLite; on PostgreSQL autovacuum "
                           "reuses the space, and VACUUM FULL or pg_repack return it to the OS "
                           "(docs/operations/retention.md)")
    path = database_path(connection.settings_dict["NAME"])
    if path is None:
        raise PruneRefused("an in-memory database has no file to shrink")
    before = _size(str(path))
    connection.ensure_connection()
    raw = connection.connection
    mode = "incremental"
    if raw.execute("PRAGMA auto_vacuum").fetchone()[0] != _INCREMENTAL:
        mode = "vacuum"
        with _queue(connection):
            raw.execute("PRAGMA auto_vacuum = INCREMENTAL")
            raw.executescript("VACUUM;")
    else:
        while raw.execute("PRAGMA freelist_count").fetchone()[0]:
            with _queue(connection):  # a short write each: workers get in between
                # executescript steps the pragma to its end (execute frees one page a step)
                raw.executescript(f"PRAGMA incremental_vacuum({STEP_PAGES});")
    with _queue(connection):
        busy = raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    return Reclaimed(before, _size(str(path)), mode, checkpointed=not busy)


def _size(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, f"{path}-wal") if os.path.exists(p))


@contextmanager
def _queue(connection: object) -> Iterator[None]:
    """Hold the runtime's writer queue (its workers wait there, not in SQLite's busy loop)."""
    held = connection.writer_queue_held() if isinstance(connection, QueuedSQLite) \
        else nullcontext()
    with held:
        yield
