"""This thread's database connection, as the loop and a worker's slots handle it between
calls: closed after a fault, and given back before a wait outside the database where the
process's threads lend each other their engine's connections (a PostgreSQL worker with more
threads than its pool has connections: ``storage.postgres.pool``)."""

from __future__ import annotations

import logging

from django.db import DEFAULT_DB_ALIAS, connections

log = logging.getLogger("runtime.store")

# In a DATABASES entry: this process's threads lend each other its connections.
LEND = "RUNTIME_LEND_CONNECTIONS"
# In a DATABASES entry: this process takes its connections from a pool (a close gives one back).
POOLED = "RUNTIME_POOLED_CONNECTIONS"


def close_connection() -> None:
    """Drop this thread's connection (the next query opens a new one)."""
    try:
        connections[DEFAULT_DB_ALIAS].close()
    except Exception:  # a connection that is already broken may fail to close: it is gone
        log.debug("closing a failed connection failed", exc_info=True)


def connection_release() -> None:
    """Give this thread's connection back before a wait outside the database (an LLM, a tool,
    a backoff, an idle slot) where runs lend their connections, so a run in flight holds one
    only while it talks to the database. Nothing elsewhere (SQLite; no pool; a pool with a
    connection for every thread) or inside a transaction."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.settings_dict.get(LEND) and db.connection is not None and not db.in_atomic_block:
        db.close()


def connection_give_back() -> None:
    """After a call on a thread shared by many runs (the event-loop worker's pool for blocking
    calls): where connections come from a pool, this thread's goes back to it, so a thread
    that seldom talks to the database holds none between calls. Nothing elsewhere (SQLite, no
    pool) or inside a transaction."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.settings_dict.get(POOLED) and db.connection is not None and not db.in_atomic_block:
        db.close()
