"""The committer for the default connection's engine."""

from __future__ import annotations

import logging

from django.db import DEFAULT_DB_ALIAS, connections

from runtime.errors import one_line
from runtime.storage.base import Engine
from runtime.storage.faults import DATABASE_FAULTS
from runtime.storage.sqlite.committer import SqliteEngine

log = logging.getLogger("runtime.store")

_engines: dict[str, Engine] = {}


def engine(using: str = DEFAULT_DB_ALIAS) -> Engine:
    """The committer for the connection's vendor (one instance per vendor)."""
    vendor = connections[using].vendor
    found = _engines.get(vendor)
    if found is None:
        if vendor == "postgresql":
            # psycopg is an optional dependency (the "postgres" extra): loaded only here
            from runtime.storage.postgres.committer import PostgresEngine  # optional psycopg

            found = PostgresEngine()
        elif vendor == "sqlite":
            found = SqliteEngine()
        else:
            raise NotImplementedError(f"the runtime supports SQLite and PostgreSQL, not {vendor}")
        _engines[vendor] = found
    return found


def notify_ready() -> None:
    """Tell idle workers a run became ready (after the commit that made it so)."""
    try:
        engine().notify_ready()
    except DATABASE_FAULTS as exc:  # a missed wake-up costs one poll interval, nothing more
        log.warning("could not notify workers: %s", one_line(exc))
