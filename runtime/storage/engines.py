"""Which engine writes: ``engine()`` gives the committer of the default connection's vendor
(``storage.sqlite.committer`` or ``storage.postgres.committer``), and the few things every
caller asks of it: the time a lease is judged by, and the wake-up after a run became
ready."""

from __future__ import annotations

import logging
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import BooleanField, ExpressionWrapper

from runtime.errors import one_line
from runtime.storage.base import Engine
from runtime.storage.faults import DATABASE_FAULTS
from runtime.storage.leases import lease_gone_q
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


def now_expression(clock: Any) -> Any:
    """The time a lease is judged by, as a query expression (the server's clock, or
    ``clock``'s value read now)."""
    return engine().now_expression(clock)


def lease_expired(clock: Any) -> ExpressionWrapper:
    """Whether a run's lease is gone by the database's time (``storage.leases``), as a query
    expression: claims, the landed check, the diagnosis and the run page all judge it so."""
    return ExpressionWrapper(lease_gone_q(now_expression(clock)), output_field=BooleanField())


def notify_ready() -> None:
    """Tell idle workers a run became ready (after the commit that made it so)."""
    try:
        engine().notify_ready()
    except DATABASE_FAULTS as exc:  # a missed wake-up costs one poll interval, nothing more
        log.warning("could not notify workers: %s", one_line(exc))
