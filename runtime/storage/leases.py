"""When a lease holds, written once: a run's lease is live while its expiry is after the time
it is judged by, and gone otherwise (no expiry, or one at or before that time). That time is
the database server's clock inside the statement on PostgreSQL, the clock read inside the
write transaction on SQLite (design §6).

Every statement that judges a lease renders the rule from here: the fences of a lease
holder's commits and of a takeover, the claims' look for runs whose lease is gone, the
heartbeat's renewal, the landed check after a fault, the diagnosis of a refused commit, and
the console's run page (``storage.engines.lease_expired``, the query-expression form).
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q

EXPIRES = '"lease_expires_at"'


def lease_live_sql(now: str) -> str:
    """SQL that is true while a lease holds at ``now`` (a placeholder, or the server's
    clock): its expiry is after it."""
    return f"{EXPIRES} > {now}"


def lease_gone_sql(now: str, *, held: bool = False) -> str:
    """SQL that is true once a lease is gone at ``now``: no expiry, or one at or before it.
    Exactly the rows ``lease_live_sql`` leaves out, NULL included.

    ``held``: for rows that carry a lease (a running run always has an expiry) the test
    reduces to the expiry being at or before ``now``, a range the (status, lease_expires_at)
    index serves; with the NULL test beside it SQLite reads every running run instead."""
    if held:
        return f"{EXPIRES} <= {now}"
    return f"({EXPIRES} IS NULL OR {EXPIRES} <= {now})"


def lease_gone_q(now: Any) -> Q:
    """``lease_gone_sql`` as a query condition, ``now`` a query expression."""
    return Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now)
