"""PostgreSQL connections from a pool for a worker's threads."""

from __future__ import annotations

from django.db import (
    DEFAULT_DB_ALIAS,
    connections,
)

from runtime.storage.postgres.network import pool_capacity, with_pool

# In a DATABASES entry: this process's threads lend each other its pool's connections.
LEND = "RUNTIME_LEND_CONNECTIONS"


def connection_pool_start(threads: int) -> None:
    """From now on, take this process's PostgreSQL connections from a pool
    (``runtime.storage.postgres.network``: ``RUNTIME_PG_POOL_SIZE``), as a worker of ``threads``
    threads does. If the pool has fewer connections than that, its runs lend them: each holds one
    only while it talks to the database (``connection_release``); if not, each thread keeps the
    one it took, and no step pays for a return and a checkout. Nothing on SQLite or where the
    settings chose otherwise. Other processes (the console, commands) keep Django's connection per
    request: a pooled connection that died with a restarted server would fail the request that
    drew it, where a worker rides the error out."""
    db = connections[DEFAULT_DB_ALIAS]
    pooled = with_pool(db.settings_dict)
    if pooled is not db.settings_dict:
        db.close()  # opened before the pool: closed, not lent
        db.settings_dict["OPTIONS"] = pooled["OPTIONS"]  # every thread's wrapper shares it
    capacity = pool_capacity(db.settings_dict)
    if capacity is not None:
        db.settings_dict[LEND] = threads > capacity


def connection_release() -> None:
    """Give this thread's connection back to the pool before a wait outside the database (an
    LLM, a tool, a backoff, an idle slot), where runs lend their connections
    (``connection_pool_start``), so a run in flight holds one only while it talks to the
    database. Nothing elsewhere (SQLite; no pool; a pool with a connection for every thread)
    or inside a transaction."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.settings_dict.get(LEND) and db.connection is not None and not db.in_atomic_block:
        db.close()
