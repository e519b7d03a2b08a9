"""A PostgreSQL worker's connections from a pool: its threads lend each other the pool's
connections when it has more threads than the pool has connections."""

from __future__ import annotations

from django.db import (
    DEFAULT_DB_ALIAS,
    connections,
)

from runtime.storage.connections import LEND, POOLED
from runtime.storage.postgres.network import pool_capacity, with_pool


def connection_pool_start(threads: int) -> None:
    """From now on, take this process's PostgreSQL connections from a pool
    (``RUNTIME_PG_POOL_SIZE``, ``storage.postgres.network``), as a worker of ``threads``
    threads does. If the pool has fewer connections than that, its runs lend them: each holds
    one only while it talks to the database (``storage.connections.connection_release``); if
    not, each thread keeps the one it took, and no step pays for a return and a checkout.
    Nothing where the settings chose otherwise. Other processes (the console, commands) keep
    Django's connection per request: a pooled connection that died with a restarted server
    would fail the request that drew it, where a worker rides the error out."""
    db = connections[DEFAULT_DB_ALIAS]
    pooled = with_pool(db.settings_dict)
    if pooled is not db.settings_dict:
        db.close()  # opened before the pool: closed, not lent
        db.settings_dict["OPTIONS"] = pooled["OPTIONS"]  # every thread's wrapper shares it
    capacity = pool_capacity(db.settings_dict)
    if capacity is not None:
        db.settings_dict[LEND] = threads > capacity
        db.settings_dict[POOLED] = True
