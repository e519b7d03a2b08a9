"""Counting what the database really did: statements and synced commits on a connection.

Used by the tests and the benchmark to report commits per step as counted, not assumed.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
from types import TracebackType
from typing import Any

from django.db import connections
from django.db.backends.signals import connection_created

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


class PgTrace:
    """Counts what a PostgreSQL connection really sent, from libpq's own protocol trace:
    ``round_trips`` (each batch the client sent and waited for: a simple Query, or an
    extended-protocol batch ending in Sync) and ``statements`` (executions, BEGIN and COMMIT
    included). Where a pool lends connections, this thread may hold several in turn (it gives
    one back before an outside call): every one it takes while active is traced."""

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self.round_trips = 0
        self.statements = 0
        self._file: Any = None
        self._thread = threading.get_ident()
        self._traced: list[Any] = []

    def __enter__(self) -> PgTrace:
        conn = connections[self.using]
        if conn.vendor != "postgresql":
            raise RuntimeError("PgTrace counts PostgreSQL connections only")
        self._thread = threading.get_ident()
        self._file = tempfile.TemporaryFile("w+")
        connection_created.connect(self._taken)
        conn.ensure_connection()
        self._trace(conn.connection.pgconn)
        return self

    def _taken(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        if (connection.alias == self.using and threading.get_ident() == self._thread
                and connection.connection is not None):
            self._trace(connection.connection.pgconn)

    def _trace(self, pgconn: Any) -> None:
        if not any(pgconn is seen for seen in self._traced):
            pgconn.trace(self._file.fileno())
            self._traced.append(pgconn)

    def __exit__(self, *exc: object) -> None:
        connection_created.disconnect(self._taken)
        for pgconn in self._traced:
            with contextlib.suppress(Exception):  # a connection closed meanwhile traces nothing
                pgconn.untrace()
        self._traced.clear()
        self._file.seek(0)
        for line in self._file:
            fields = line.split("\t", 4)
            if len(fields) < 4 or fields[1] != "F":
                continue
            kind = fields[3].strip()
            if kind in ("Sync", "Query"):
                self.round_trips += 1
            if kind in ("Execute", "Query"):
                self.statements += 1
        self._file.close()
