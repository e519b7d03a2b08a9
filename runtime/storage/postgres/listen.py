"""Waking idle workers on PostgreSQL: ``LISTEN runtime_ready`` on a connection of their own.

``notify_ready`` (``storage.engines``) sends the notification after every commit that makes a
run ready (created, approved or resolved, released to the queue); PostgreSQL delivers it to
every listener. A lost listening connection is reopened on the next wait; what was notified
while it was down is found by the next poll.
"""

from __future__ import annotations

import contextlib
import logging
import time

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections

log = logging.getLogger("runtime.worker")

CHANNEL = "runtime_ready"  # what a commit that made a run ready notifies


class ReadyListener:
    """One autocommit connection listening on ``runtime_ready``."""

    def __init__(self, using: str = DEFAULT_DB_ALIAS) -> None:
        self.using = using
        self._conn: psycopg.Connection | None = None
        self._retry_at = 0.0

    def _connect(self) -> psycopg.Connection | None:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        if time.monotonic() < self._retry_at:
            return None
        db = connections[self.using]
        params = db.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        params.pop("prepare_threshold", None)
        try:
            self._conn = psycopg.connect(autocommit=True, **params)
            self._conn.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as exc:
            log.warning("cannot listen for ready runs (polling instead): %s",
                        " ".join(str(exc).split())[:200])
            self._conn, self._retry_at = None, time.monotonic() + 2.0
        return self._conn

    def fileno(self) -> int | None:
        """The listening socket to wait on (reconnecting when due); None while there is none."""
        conn = self._connect()
        return None if conn is None else conn.fileno()

    def drain(self) -> bool:
        """Take in what arrived on the socket; True if it held a notification (several that
        arrived together count once)."""
        conn = self._conn
        if conn is None:
            return False
        try:
            return any(True for _ in conn.notifies(timeout=0))
        except (psycopg.Error, OSError) as exc:
            log.warning("lost the listening connection: %s", " ".join(str(exc).split())[:200])
            self.close()
            return False

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
        self._conn = None
