"""The global audit chain: every run's creation, in order, each entry hashed after the last.

A run's own chain proves its events were not edited; it cannot prove the run still exists.
This chain can: a run deleted with everything it owns leaves its creation entry (with no run),
and an entry removed leaves a gap or a broken hash. Each entry also carries the hash of the
run's event #1, so the ``run.created`` event (agent, input, who started it) is pinned too.
What neither chain can show on its own, a rewrite of a whole chain by someone who can drop
the triggers, a signed checkpoint kept off the database shows (``runtime.audit.checkpoint``).
"""

from __future__ import annotations

from datetime import datetime

from django.db import connections

from runtime.canonical import chain_hash, dumps, iso_time
from runtime.models import RunCreation

# Any constant works; it only has to be the one every run creation takes on PostgreSQL.
_CREATION_LOCK = 0x72756E6372656174  # "runcreat"


def creation_hash(prev_hash: str, *, seq: int, run_id: int, agent: str, created_by: str,
                  at: datetime, first_hash: str) -> str:
    body = dumps({"seq": seq, "run": run_id, "agent": agent, "created_by": created_by,
                  "at": iso_time(at),
                  "first": first_hash})
    return chain_hash(prev_hash, body)


def run_creation_append_in_tx(run_id: int, agent: str, created_by: str, at: datetime,
                              first_hash: str, using: str = "default") -> None:
    """Append the run's creation to the global chain, inside the transaction that creates it.

    Appends must not interleave (two would chain after the same entry): SQLite's write lock,
    which the run's insert already holds, orders them; PostgreSQL takes a transaction-scoped
    advisory lock, released by the commit.
    """

    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [_CREATION_LOCK])
    last = RunCreation.objects.using(using).order_by("-seq").values_list("seq", "hash").first()
    seq, prev = last if last is not None else (0, "")
    seq += 1
    RunCreation.objects.using(using).create(
        seq=seq, run_id=run_id, agent=agent, created_by=created_by, at=at,
        first_hash=first_hash, hash=creation_hash(prev, seq=seq, run_id=run_id, agent=agent,
                                                  created_by=created_by, at=at,
                                                  first_hash=first_hash))


def creations_head(using: str = "default") -> tuple[int, str]:
    """The global chain's last entry: (seq, hash), or (0, "") when no run was ever created."""

    last = RunCreation.objects.using(using).order_by("-seq").values_list("seq", "hash").first()
    return last if last is not None else (0, "")
