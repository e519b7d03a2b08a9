"""The record of prunings: each batch archived and removed is a ``Pruning`` chained by hash after
the one before, with a ``PrunedRun`` per run it removed, written in the transaction that
removes them; and the check of that record against itself (what plain ``verifyaudit`` runs).

Removing runs must not look like deleting them. The global chain keeps every pruned run's
creation entry and ``verifyaudit`` accepts the run's absence because ``PrunedRun`` names it;
so the record has to be as hard to forge as the rest: append-only by trigger, chained,
each pruning's heads digest covering its runs, and the archive's SHA-256 tying the file to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from runtime.audit.checkpoint import heads_digest
from runtime.canonical import chain_hash, dumps, iso_time
from runtime.errors import PruneRefused
from runtime.models import PrunedRun, Pruning, Run


def pruning_fields(*, seq: int, at: datetime, by: str, finished_before: datetime,
                   checkpoint_seq: int | None, heads: list[list], events: int, archive: str,
                   archive_sha256: str) -> dict[str, Any]:
    """A pruning's columns (without the chain's), from the heads of the runs it removes."""
    return {"seq": seq, "at": at, "by": by, "finished_before": finished_before,
            "checkpoint_seq": checkpoint_seq, "first_run_id": heads[0][0],
            "last_run_id": heads[-1][0], "runs": len(heads), "events": events,
            "heads_digest": heads_digest(heads), "archive": archive,
            "archive_sha256": archive_sha256}


def pruning_hash(prev_hash: str, fields: dict[str, Any]) -> str:
    """The chain's link for a pruning: its fields (times as ``iso_time``) after ``prev_hash``."""
    body = {k: iso_time(v) if isinstance(v, datetime) else v for k, v in fields.items()}
    return chain_hash(prev_hash, dumps(body))


def next_pruning_seq(using: str = "default") -> int:
    last = Pruning.objects.using(using).order_by("-seq").values_list("seq", flat=True).first()
    return 1 if last is None else last + 1


def pruning_append_in_tx(fields: dict[str, Any], heads: list[list],
                         using: str = "default") -> Pruning:
    """Enter the pruning and its runs (the permit for their events' DELETE), inside the
    transaction that removes them; refused when another prune took this ``seq`` meanwhile."""
    last = Pruning.objects.using(using).order_by("-seq").values_list("seq", "hash").first()
    seq, prev = (last[0] + 1, last[1]) if last else (1, "")
    if seq != fields["seq"]:
        raise PruneRefused(f"another prune recorded pruning #{seq - 1} meanwhile; run prune "
                           "again (this batch's archive is replaced by the next one)")
    PrunedRun.objects.using(using).bulk_create(
        [PrunedRun(run_id=r, pruning_seq=seq, event_seq=s, event_hash=h) for r, s, h in heads])
    return Pruning.objects.using(using).create(**fields, prev_hash=prev,
                                               hash=pruning_hash(prev, fields))


def prunings_problems(using: str = "default") -> Iterator[str]:
    """Every way the record of prunings disagrees with itself: a gap or a broken link in its
    chain, a pruning whose runs do not match its count, range or heads digest, a run entered
    as pruned without a pruning, or still in the database. Streams both tables side by side."""

    groups = _entered_by_pruning(using)
    group = next(groups, None)
    prev, expected = "", 1
    for row in Pruning.objects.using(using).order_by("seq").iterator(chunk_size=1000):
        if row.seq != expected:
            yield (f"prunings: record #{expected} is missing (next is #{row.seq}): a "
                   "pruning's record was deleted")
        fields = {k: getattr(row, k) for k in (
            "seq", "at", "by", "finished_before", "checkpoint_seq", "first_run_id",
            "last_run_id", "runs", "events", "heads_digest", "archive", "archive_sha256")}
        if row.prev_hash != prev or pruning_hash(prev, fields) != row.hash:
            yield (f"prunings: record #{row.seq} does not hash after the one before: records "
                   "were altered, removed or reordered")
        while group is not None and group[0] < row.seq:
            yield _unrecorded(*group)
            group = next(groups, None)
        heads: list[list] = []
        if group is not None and group[0] == row.seq:
            heads, group = group[1], next(groups, None)
        if (len(heads) != row.runs or not heads or heads[0][0] != row.first_run_id
                or heads[-1][0] != row.last_run_id or heads_digest(heads) != row.heads_digest):
            yield (f"pruning #{row.seq}: its runs on record ({len(heads)}) are not the "
                   f"{row.runs} it removed (runs {row.first_run_id}..{row.last_run_id})")
        prev, expected = row.hash, row.seq + 1
    while group is not None:
        yield _unrecorded(*group)
        group = next(groups, None)
    alive = list(Run.objects.using(using).filter(
        pk__in=PrunedRun.objects.using(using).values("run_id")).values_list("pk", flat=True)[:10])
    if alive:
        yield (f"runs {alive} are entered as pruned but still in the database: their events "
               "can be deleted at will")


def _entered_by_pruning(using: str) -> Iterator[tuple[int, list[list]]]:
    """``PrunedRun`` rows as (pruning seq, [[run id, event seq, head], ...]), in seq order."""
    rows = PrunedRun.objects.using(using).order_by("pruning_seq", "run_id").values_list(
        "pruning_seq", "run_id", "event_seq", "event_hash")
    current: int | None = None
    heads: list[list] = []
    for pruning_seq, run_id, seq, head in rows.iterator(chunk_size=5000):
        if pruning_seq != current:
            if current is not None:
                yield current, heads
            current, heads = pruning_seq, []
        heads.append([run_id, seq, head])
    if current is not None:
        yield current, heads


def _unrecorded(pruning_seq: int, heads: list[list]) -> str:
    ids = [h[0] for h in heads]
    return (f"runs {ids[:10]}{' ...' if len(ids) > 10 else ''} are entered as pruned by "
            f"#{pruning_seq}, which is not on record: their events could be deleted without "
            "a pruning")
