"""Checking the global audit chain of run creations."""

from __future__ import annotations

from collections.abc import Iterator

from runtime.models import Event, PrunedRun, Run, RunCreation
from runtime.storage.creations import creation_hash


def creations_verify(using: str = "default", chunk: int = 2000) -> Iterator[str]:
    """Every problem with the global chain: a gap, a hash that does not follow, an entry whose
    run is gone or differs from it, a run with no entry. Reads in chunks (no run list in
    memory)."""

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

    ids = [e.run_id for e in batch]
    runs = {r[0]: r[1:] for r in Run.objects.using(using).filter(pk__in=ids).values_list(
        "pk", "agent", "created_by", "created_at")}
    firsts = dict(Event.objects.using(using).filter(run_id__in=ids, seq=1).values_list(
        "run_id", "hash"))
    gone = [i for i in ids if i not in runs]
    # Archived and removed by `manage.py prune`: on record, not deleted (runtime.retention
    # checks the record; `verifyaudit --archive` the archived run against this entry).
    pruned = set(PrunedRun.objects.using(using).filter(run_id__in=gone).values_list(
        "run_id", flat=True)) if gone else set()
    for entry in batch:
        found = runs.get(entry.run_id)
        if found is None and entry.run_id in pruned:
            continue
        if found is None:
            yield (f"run {entry.run_id} was deleted: the global chain records its creation "
                   f"(entry #{entry.seq}, agent {entry.agent}, at {entry.at.isoformat()})")
        elif found != (entry.agent, entry.created_by, entry.at):
            yield (f"run {entry.run_id}: agent, creator or creation time differ from its "
                   f"creation record (entry #{entry.seq})")
        elif firsts.get(entry.run_id) != entry.first_hash:
            yield (f"run {entry.run_id}: its run.created event is not the one the global chain "
                   f"recorded (entry #{entry.seq}): the run's chain was rewritten")
