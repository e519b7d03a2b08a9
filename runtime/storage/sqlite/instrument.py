"""Counting what the database really did: statements and synced commits on a connection.

Used by the tests and the benchmark to report commits per step as counted, not assumed.
"""

from __future__ import annotations

from types import TracebackType

from django.db import connections

_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


class SqliteCounter:
    """Counts statements SQLite executed on this thread's connection while active.

    ``commits`` is every COMMIT plus every write run in autocommit mode (its own commit);
    a rolled-back transaction is not a commit.
    """

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self.statements = 0
        self.commits = 0
        self.rollbacks = 0
        self._in_tx = False

    def _trace(self, sql: str) -> None:
        head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        if head == "BEGIN":
            self._in_tx = True
            return
        if head == "COMMIT" or head == "END":
            self._in_tx = False
            self.commits += 1
            return
        if head == "ROLLBACK" and not sql.upper().startswith("ROLLBACK TO"):
            self._in_tx = False
            self.rollbacks += 1
            return
        if head in ("SAVEPOINT", "RELEASE", "ROLLBACK"):
            return
        self.statements += 1
        if head in _WRITES and not self._in_tx:
            self.commits += 1

    def __enter__(self) -> SqliteCounter:
        conn = connections[self.using]
        if conn.vendor != "sqlite":
            raise RuntimeError("SqliteCounter counts SQLite connections only")
        conn.ensure_connection()
        conn.connection.set_trace_callback(self._trace)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        conn = connections[self.using]
        if conn.connection is not None:
            conn.connection.set_trace_callback(None)
