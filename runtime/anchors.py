"""The global audit chain: every run's creation, in order, each entry hashed after the last.

A run's own chain proves its events were not edited; it cannot prove the run still exists.
This chain can: a run deleted with everything it owns leaves its creation entry (with no run),
and an entry removed leaves a gap or a broken hash. Each entry also carries the hash of the
run's event #1, so the ``run.created`` event (agent, input, who started it) is pinned too.
What neither chain can show on its own, a rewrite of a whole chain by someone who can drop
the triggers, a signed checkpoint kept off the database shows (``runtime.checkpoint``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

from django.db import connections

from .canonical import chain_hash, dumps

# Any constant works; it only has to be the one every run creation takes on PostgreSQL.
_CREATION_LOCK = 0x72756E6372656174  # "runcreat"


def creation_hash(prev_hash: str, *, seq: int, run_id: int, agent: str, created_by: str,
                  at: datetime, first_hash: str) -> str:
    body = dumps({"seq": seq, "run": run_id, "agent": agent, "created_by": created_by,
                  "at": at.astimezone(UTC).isoformat(timespec="microseconds"),
                  "first": first_hash})
    return chain_hash(prev_hash, body)


def run_creation_append_in_tx(run_id: int, agent: str, created_by: str, at: datetime,
                              first_hash: str, using: str = "default") -> None:
    """Append the run's creation to the global chain, inside the transaction that creates it.

    Appends must not interleave (two would chain after the same entry): SQLite's write lock,
    which the run's insert already holds, orders them; PostgreSQL takes a transaction-scoped
    advisory lock, released by the commit.
    """
    from .models import RunCreation

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
    from .models import RunCreation

    last = RunCreation.objects.using(using).order_by("-seq").values_list("seq", "hash").first()
    return last if last is not None else (0, "")


def creations_verify(using: str = "default", chunk: int = 2000) -> Iterator[str]:
    """Every problem with the global chain: a gap, a hash that does not follow, an entry whose
    run is gone or differs from it, a run with no entry. Reads in chunks (no run list in
    memory)."""
    from .models import Run, RunCreation

    prev, expected, seen = "", 1, 0
    creations = RunCreation.objects.using(using).order_by("seq")
    batch: list[RunCreation] = []
    for entry in creations.iterator(chunk_size=chunk):
        seen += 1
        if entry.seq != expected:
            yield (f"global chain: entry #{expected} is missing (next is #{entry.seq}): a run's "
                   "creation record was deleted")
            expected = entry.seq
        want = creation_hash(prev, seq=entry.seq, run_id=entry.run_id, agent=entry.agent,
                             created_by=entry.created_by, at=entry.at,
                             first_hash=entry.first_hash)
        if want != entry.hash:
            yield (f"global chain: entry #{entry.seq} (run {entry.run_id}) does not hash "
                   "after the one before: entries were altered, removed or reordered")
        prev, expected = entry.hash, expected + 1
        batch.append(entry)
        if len(batch) == chunk:
            yield from _entries_match_runs(batch, using)
            batch = []
    if batch:
        yield from _entries_match_runs(batch, using)
    runs = Run.objects.using(using).count()
    if runs != seen:
        have = RunCreation.objects.using(using).values("run_id")
        orphans = Run.objects.using(using).exclude(pk__in=have).order_by("pk")
        ids = list(orphans.values_list("pk", flat=True)[:10])
        if ids:
            yield (f"global chain: {len(ids)}{'+' if len(ids) == 10 else ''} run(s) have no "
                   f"creation entry (inserted behind the runtime's back): {ids}")


def _entries_match_runs(batch: list, using: str) -> Iterator[str]:
    from .models import Event, Run

    ids = [e.run_id for e in batch]
    runs = {r[0]: r[1:] for r in Run.objects.using(using).filter(pk__in=ids).values_list(
        "pk", "agent", "created_by", "created_at")}
    firsts = dict(Event.objects.using(using).filter(run_id__in=ids, seq=1).values_list(
        "run_id", "hash"))
    for entry in batch:
        found = runs.get(entry.run_id)
        if found is None:
            yield (f"run {entry.run_id} was deleted: the global chain records its creation "
                   f"(entry #{entry.seq}, agent {entry.agent}, at {entry.at.isoformat()})")
        elif found != (entry.agent, entry.created_by, entry.at):
            yield (f"run {entry.run_id}: agent, creator or creation time differ from its "
                   f"creation record (entry #{entry.seq})")
        elif firsts.get(entry.run_id) != entry.first_hash:
            yield (f"run {entry.run_id}: its run.created event is not the one the global chain "
                   f"recorded (entry #{entry.seq}): the run's chain was rewritten")
