"""Database faults a worker rides out instead of giving up: which errors they are, and how a
thread steps back from one (its connection dropped, a jittered pause)."""

from __future__ import annotations

import logging
import random
import time

from django.db import (
    DEFAULT_DB_ALIAS,
    InterfaceError,
    InternalError,
    OperationalError,
    connections,
)

log = logging.getLogger("runtime.store")

# What a worker rides out instead of giving up: the database was busy, went away, restarted,
# or (after a failover) is read-only for a while.
DATABASE_FAULTS = (OperationalError, InterfaceError, InternalError)


def pause_after_fault(delay: float) -> None:
    """Drop this thread's connection (the next query opens a new one) and back off, with
    jitter so workers that lost the same server do not return in step."""
    close_connection()
    time.sleep(delay * random.uniform(0.5, 1.0))


def close_connection() -> None:
    try:
        connections[DEFAULT_DB_ALIAS].close()
    except Exception:  # a connection that is already broken may fail to close: it is gone
        log.debug("closing a failed connection failed", exc_info=True)
