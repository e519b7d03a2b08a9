"""Database faults a worker rides out instead of giving up: which errors they are, and how a
thread steps back from one (its connection dropped, a jittered pause)."""

from __future__ import annotations

import random
import time

from django.db import InterfaceError, InternalError, OperationalError

from runtime.storage.connections import close_connection

# What a worker rides out instead of giving up: the database was busy, went away, restarted,
# or (after a failover) is read-only for a while.
DATABASE_FAULTS = (OperationalError, InterfaceError, InternalError)


def pause_after_fault(delay: float) -> None:
    """Drop this thread's connection (the next query opens a new one) and back off, with
    jitter so workers that lost the same server do not return in step."""
    close_connection()
    time.sleep(delay * random.uniform(0.5, 1.0))
