"""Audit exports an auditor can take away: events or decisions, filtered, as CSV or JSON lines,
streamed, each line carrying the chain hash it is checked by; every export on record.

**Streamed.** Rows are read ``.iterator(chunk_size=...)`` in (run, seq) order, the unique
index's, and written a chunk at a time: a million events take the memory of one chunk.

**Checkable.** An event's line holds every field its hash covers (run, seq, step, kind, actor,
time, payload as canonical JSON) and the hash: the line without its hash, as canonical JSON, is
exactly what the chain hashed after the previous event's hash (``runtime.storage.events``). So
a run exported from its event #1 is re-chained from the lines alone, and its last hash compared
with a signed checkpoint's head (``runtime.audit.export_check``). A filtered export (a time
window, one actor) holds pieces of chains: each piece links line to line, but its first line
needs the hash before it, which only the database or a checkpoint reaching the piece can vouch
for. A decision's line names the event that recorded it (run, seq, hash).

**On record.** Each export is an ``AuditExport`` row, chained after the export before and
append-only by trigger, written when the export ends, also when it stopped part-way
(``complete`` false, ``rows`` what was written), with the SHA-256 of the bytes exported.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from runtime.canonical import chain_hash, dumps, iso_time, iso_time_or_none
from runtime.clock import SYSTEM_CLOCK
from runtime.errors import ExportRefused
from runtime.models import Approval, AuditExport, Event

WHATS = ("events", "decisions")
FORMATS = ("csv", "jsonl")
EVENT_FIELDS = ("run", "seq", "step", "kind", "actor", "at", "payload", "hash")
DECISION_FIELDS = ("approval", "run", "step", "tool", "effect", "digest", "effective_digest",
                   "edited_by", "kind", "status", "decided_by", "decided_at", "note",
                   "event_seq", "event_hash")
# The event that records each decided status (a person's decision, the deadline's, or a
# cancellation, which also sets ``decided_at``), naming its approval.
DECISION_KIND = {"approved": "approval.granted", "consumed": "approval.granted",
                 "rejected": "approval.rejected", "resolved": "approval.resolved",
                 "expired": "approval.expired", "cancelled": "approval.cancelled"}
DECISION_KINDS = tuple(sorted(set(DECISION_KIND.values())))
CHUNK = 2000  # rows read per query round-trip, and written per chunk of output
MAX_ID = 2**63 - 1
MAX_TIME_TEXT = 64
LIMITS = {"agent": 200, "actor": 255, "by": 150}


@dataclass(frozen=True)
class ExportFilters:
    """Which rows: ``since`` inclusive, ``until`` exclusive (UTC), an agent, a run, an actor
    (an event's actor, or a decision's decider)."""

    since: datetime | None = None
    until: datetime | None = None
    agent: str = ""
    run: int | None = None
    actor: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The filters that are set, as the record keeps them (times as ``iso_time``)."""
        out = {"since": iso_time_or_none(self.since), "until": iso_time_or_none(self.until),
               "agent": self.agent or None, "run": self.run, "actor": self.actor or None}
        return {k: v for k, v in out.items() if v is not None}


def export_time(name: str, value: datetime | str | None) -> datetime | None:
    """A filter's time: a datetime, or ISO 8601 text (a date means its midnight; no zone
    means UTC); ``ExportRefused`` naming the filter for anything else."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        text = value.strip()
        if len(text) > MAX_TIME_TEXT:
            raise ExportRefused(name, f"longer than {MAX_TIME_TEXT} characters: not a time")
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            raise ExportRefused(name, f"{text!r} is not an ISO 8601 time (for example "
                                "2026-01-31 or 2026-01-31T09:00:00+00:00)") from None
    if not isinstance(value, datetime):
        raise ExportRefused(name, "not a time")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def export_filters(*, since: datetime | str | None = None, until: datetime | str | None = None,
                   agent: str | None = None, run: int | str | None = None,
                   actor: str | None = None) -> ExportFilters:
    """The filters checked and bounded: a bad one is refused (``ExportRefused``) before
    anything is read. An agent or actor nobody has is fine: it exports nothing."""
    start, end = export_time("since", since), export_time("until", until)
    if start is not None and end is not None and end <= start:
        raise ExportRefused("until", "must be later than since")
    texts = {"agent": (agent or "").strip(), "actor": (actor or "").strip()}
    for name, text in texts.items():
        if len(text) > LIMITS[name]:
            raise ExportRefused(name, f"longer than {LIMITS[name]} characters")
    number: int | None = None
    if run is not None and run != "":
        text = str(run).strip().removeprefix("#")
        if not (text.isascii() and text.isdigit()) or not 0 < int(text) <= MAX_ID:
            raise ExportRefused("run", f"{str(run)[:40]!r} is not a run id")
        number = int(text)
    return ExportFilters(start, end, texts["agent"], number, texts["actor"])


@dataclass
class Tally:
    """What an export wrote so far: rows, and the chain hash on its last line."""

    rows: int = 0
    last_hash: str = ""
    sha256: Any = field(default_factory=hashlib.sha256)


class _Echo:
    """The file ``csv.writer`` writes to: each row comes back as text (Django's streaming CSV
    pattern), never accumulated."""

    def write(self, value: str) -> str:
        return value


def _events(f: ExportFilters, using: str) -> QuerySet:
    qs = Event.objects.using(using).order_by("run_id", "seq")
    if f.run is not None:
        qs = qs.filter(run_id=f.run)
    if f.agent:
        qs = qs.filter(run__agent=f.agent)
    if f.actor:
        qs = qs.filter(actor=f.actor)
    if f.since is not None:
        qs = qs.filter(at__gte=f.since)
    if f.until is not None:
        qs = qs.filter(at__lt=f.until)
    return qs


def _event_rows(f: ExportFilters, using: str, tally: Tally) -> Iterator[dict[str, Any]]:
    rows = _events(f, using).values_list("run_id", "seq", "step_index", "kind", "actor", "at",
                                         "payload", "hash")
    for run_id, seq, step, kind, actor, at, payload, hashed in rows.iterator(chunk_size=CHUNK):
        tally.last_hash = hashed
        yield {"run": run_id, "seq": seq, "step": step, "kind": kind, "actor": actor,
               "at": iso_time(at), "payload": payload, "hash": hashed}


def _decisions(f: ExportFilters, using: str) -> QuerySet:
    qs = Approval.objects.using(using).filter(decided_at__isnull=False).order_by("run_id", "id")
    if f.run is not None:
        qs = qs.filter(run_id=f.run)
    if f.agent:
        qs = qs.filter(run__agent=f.agent)
    if f.actor:
        qs = qs.filter(decided_by=f.actor)
    if f.since is not None:
        qs = qs.filter(decided_at__gte=f.since)
    if f.until is not None:
        qs = qs.filter(decided_at__lt=f.until)
    return qs


_DECISION_COLUMNS = ("id", "run_id", "step__index", "tool", "effect", "digest",
                     "effective_digest", "edited_by", "kind", "status", "decided_by",
                     "decided_at", "note")


def _decision_rows(f: ExportFilters, using: str, tally: Tally) -> Iterator[dict[str, Any]]:
    batch: list[tuple] = []
    rows = _decisions(f, using).values_list(*_DECISION_COLUMNS)
    for row in rows.iterator(chunk_size=CHUNK):
        batch.append(row)
        if len(batch) == CHUNK:
            yield from _decided(batch, using, tally)
            batch = []
    yield from _decided(batch, using, tally)


def _decided(batch: list[tuple], using: str, tally: Tally) -> Iterator[dict[str, Any]]:
    """The batch's lines, each with the event that recorded the decision (one query)."""
    if not batch:
        return
    recorded: dict[tuple[Any, str], tuple[int, str]] = {}  # (approval, kind): the last one
    found = Event.objects.using(using).filter(
        run_id__in={r[1] for r in batch}, kind__in=DECISION_KINDS).order_by(
        "run_id", "seq").values_list("payload", "kind", "seq", "hash")
    for payload, kind, seq, hashed in found.iterator(chunk_size=CHUNK):
        if isinstance(payload, dict) and "approval_id" in payload:
            recorded[(payload["approval_id"], kind)] = (seq, hashed)
    for row in batch:
        line = dict(zip(DECISION_FIELDS, row, strict=False))
        line["decided_at"] = iso_time(row[11])
        line["event_seq"], line["event_hash"] = recorded.get(
            (row[0], DECISION_KIND.get(row[9], "")), (None, ""))
        tally.last_hash = line["event_hash"]
        yield line


def _lines(what: str, fmt: str, f: ExportFilters, using: str, tally: Tally) -> Iterator[str]:
    """The export's text, a chunk of ``CHUNK`` lines at a time."""
    fields = EVENT_FIELDS if what == "events" else DECISION_FIELDS
    source = _event_rows if what == "events" else _decision_rows
    writer = csv.writer(_Echo())
    lines: list[str] = [writer.writerow(fields)] if fmt == "csv" else []
    for row in source(f, using, tally):
        if fmt == "csv":
            lines.append(writer.writerow([_cell(row[k], k) for k in fields]))
        else:
            lines.append(dumps(row) + "\n")
        tally.rows += 1
        if len(lines) >= CHUNK:
            yield "".join(lines)
            lines = []
    if lines:
        yield "".join(lines)


def _cell(value: Any, name: str) -> Any:
    if name == "payload":
        return dumps(value)
    return "" if value is None else value


class ExportStream:
    """An export as chunks of text (iterate it once), recorded as an ``AuditExport`` when it
    ends: read to the end, or closed part-way (``close``, which a streaming response calls
    when the client goes). ``record`` is then the row. With ``held``, an export read to the
    end is recorded by ``finish`` instead, once the caller knows whether its bytes were kept
    (a file is whole only when synced and renamed, after its last chunk was read)."""

    def __init__(self, what: str, fmt: str, filters: ExportFilters, by: str,
                 now: datetime | None, using: str, held: bool = False) -> None:
        self.what, self.format, self.filters, self.by = what, fmt, filters, by
        self.now, self.using, self.held = now, using, held
        self.tally = Tally()
        self.record: AuditExport | None = None
        self._read_whole = False  # read to the end, its record held for ``finish``
        self._chunks = self._run()

    def __iter__(self) -> Iterator[str]:
        return self._chunks

    def close(self) -> None:
        self._chunks.close()

    def finish(self, kept: bool) -> AuditExport | None:
        """A held export's record: complete if it was read to the end and ``kept``. None when
        it never started (it exported nothing)."""
        self.close()
        if self.record is None and self._read_whole:
            self._record(complete=kept)
        return self.record

    def _run(self) -> Generator[str, None, None]:
        complete = False
        try:
            for chunk in _lines(self.what, self.format, self.filters, self.using, self.tally):
                self.tally.sha256.update(chunk.encode())
                yield chunk
            complete = True
        finally:
            if complete and self.held:
                self._read_whole = True
            else:
                self._record(complete)

    def _record(self, complete: bool) -> None:
        self.record = export_record(
            by=self.by, what=self.what, format=self.format, filters=self.filters.as_dict(),
            tally=self.tally, complete=complete, now=self.now or SYSTEM_CLOCK.now(),
            using=self.using)


def audit_export_stream(*, what: str = "events", format: str = "csv",
                        filters: ExportFilters | None = None, by: str,
                        now: datetime | None = None, using: str = "default",
                        held: bool = False) -> ExportStream:
    """The export, streamed and recorded (``ExportStream``; ``held``: see there). Bad inputs
    are refused here, before anything is read. A stream closed before its first chunk records
    nothing: it exported nothing."""
    if what not in WHATS:
        raise ExportRefused("what", f"{str(what)[:40]!r} is not one of {', '.join(WHATS)}")
    if format not in FORMATS:
        raise ExportRefused("format", f"{str(format)[:40]!r} is not one of "
                            f"{', '.join(FORMATS)}")
    by = (by or "").strip()
    if not by or len(by) > LIMITS["by"]:
        raise ExportRefused("by", f"who exports is needed, at most {LIMITS['by']} characters")
    return ExportStream(what, format, filters or ExportFilters(), by, now, using, held)


def audit_export(out: IO[str], *, what: str = "events", format: str = "csv",
                 since: datetime | str | None = None, until: datetime | str | None = None,
                 agent: str | None = None, run: int | str | None = None,
                 actor: str | None = None, by: str, now: datetime | None = None,
                 using: str = "default") -> AuditExport:
    """Write the export to ``out`` and return its record. Refused before writing anything
    when an input is bad; recorded (as incomplete) when writing fails part-way."""
    filters = export_filters(since=since, until=until, agent=agent, run=run, actor=actor)
    stream = audit_export_stream(what=what, format=format, filters=filters, by=by, now=now,
                                 using=using)
    try:
        for chunk in stream:
            out.write(chunk)
    finally:
        stream.close()
    assert stream.record is not None, "recorded when the stream ended"
    return stream.record


def export_fields(row: AuditExport) -> dict[str, Any]:
    """An export record's fields its hash covers (times as ``iso_time``)."""
    return {"seq": row.seq, "at": iso_time(row.at), "by": row.by, "what": row.what,
            "format": row.format, "filters": row.filters, "rows": row.rows,
            "complete": row.complete, "last_hash": row.last_hash, "sha256": row.sha256}


def export_record(*, by: str, what: str, format: str, filters: dict[str, Any], tally: Tally,
                  complete: bool, now: datetime, using: str = "default") -> AuditExport:
    """Append the export's record, chained after the last one (retried if another export
    took the same ``seq`` at the same moment)."""
    at = now.astimezone(UTC)
    for _ in range(5):
        try:
            with transaction.atomic(using=using):
                last = AuditExport.objects.using(using).order_by("-seq").values_list(
                    "seq", "hash").first()
                seq, prev = (last[0] + 1, last[1]) if last else (1, "")
                row = AuditExport(seq=seq, at=at, by=by, what=what, format=format,
                                  filters=filters, rows=tally.rows, complete=complete,
                                  last_hash=tally.last_hash, sha256=tally.sha256.hexdigest(),
                                  prev_hash=prev)
                row.hash = chain_hash(prev, dumps(export_fields(row)))
                row.save(using=using, force_insert=True)
                return row
        except IntegrityError:
            continue
    raise ExportRefused("", "the export could not be recorded: other exports kept taking "
                        "its place; it was written, but is not on record")


def exports_problems(using: str = "default") -> Iterator[str]:
    """Every way the record of exports disagrees with itself: a gap or a broken link."""
    prev, expected = "", 1
    for row in AuditExport.objects.using(using).order_by("seq").iterator(chunk_size=CHUNK):
        if row.seq != expected:
            yield (f"exports: record #{expected} is missing (next is #{row.seq}): an "
                   "export's record was deleted")
        if row.prev_hash != prev or chain_hash(prev, dumps(export_fields(row))) != row.hash:
            yield (f"exports: record #{row.seq} does not hash after the one before: records "
                   "were altered, removed or reordered")
        prev, expected = row.hash, row.seq + 1
