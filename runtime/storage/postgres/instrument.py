"""Counting what a PostgreSQL connection really sent."""

from __future__ import annotations

import contextlib
import tempfile
import threading
from typing import Any

from django.db import connections
from django.db.backends.signals import connection_created


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
