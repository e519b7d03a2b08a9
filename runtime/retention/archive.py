"""Archive files of pruned runs: one JSON-lines file per batch, written whole or not at all,
that ``verifyaudit --archive`` reads back.

Line 1 is a header (the format, the pruning it belongs to, the checkpoint taken first); each
further line is one run with everything it owned: its row, its creation entry of the global
chain, its steps, approvals, events, and the notifications about its approvals with their
attempts. Every row keeps all its columns as the database gave them (times as ``iso_time``, to
the microsecond; the cost as a decimal string), so a run read back verifies exactly as it did
in the database: its chain from its events, its rows replayed from them.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

from django.db import models

from runtime.audit.chain import EVENT_COLUMNS
from runtime.canonical import iso_time
from runtime.errors import ArchiveRefused
from runtime.host.files import write_whole
from runtime.models import (
    Approval,
    Event,
    Notification,
    NotificationAttempt,
    Run,
    RunCreation,
    Step,
)

FORMAT = "runtime-prune-archive"
VERSION = 1
MAX_FILE_BYTES = 4 * 1024**3  # a batch of 100 runs is megabytes; far larger is not ours

M = TypeVar("M", bound=models.Model)


def archive_name(seq: int) -> str:
    """The archive file of pruning ``seq``: a prune re-run after a crash writes the same name."""
    return f"prune-{seq:08d}.jsonl"


def checkpoint_name(seq: int) -> str:
    """The signed checkpoint a prune takes first, kept beside its archives."""
    return f"checkpoint-{seq:08d}.json"


def row_fields(row: models.Model) -> dict[str, Any]:
    """Every column of ``row``, by attribute name, as JSON data."""
    return {f.attname: _plain(f.value_from_object(row)) for f in row._meta.concrete_fields}


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso_time(value)
    if isinstance(value, Decimal):
        return str(value)
    return value


def row_from(model: type[M], fields: dict[str, Any]) -> M:
    """An unsaved ``model`` instance from ``row_fields``' output; ``ValueError`` when a column
    is missing or holds what the column cannot."""
    values = {}
    for field in model._meta.concrete_fields:
        if field.attname not in fields:
            raise ValueError(f"{model.__name__} has no {field.attname}")
        try:
            values[field.attname] = field.to_python(fields[field.attname])
        except Exception as exc:  # ValidationError, or a type the field cannot take
            raise ValueError(f"{model.__name__}.{field.attname}: {exc}") from None
    return model(**values)


def runs_read(ids: list[int], using: str = "default") -> list[dict[str, Any]]:
    """The archive records of runs ``ids``, in id order, read in a few queries."""
    steps: dict[int, list] = defaultdict(list)
    for step in Step.objects.using(using).filter(run_id__in=ids).order_by("run_id", "index"):
        steps[step.run_id].append(row_fields(step))
    approvals: dict[int, list] = defaultdict(list)
    run_of: dict[int, int] = {}
    for approval in Approval.objects.using(using).filter(run_id__in=ids).order_by("pk"):
        approvals[approval.run_id].append(row_fields(approval))
        run_of[approval.pk] = approval.run_id
    events: dict[int, list] = defaultdict(list)
    rows = Event.objects.using(using).filter(run_id__in=ids).order_by("run_id", "seq")
    for row in rows.values_list("run_id", *EVENT_COLUMNS).iterator(chunk_size=5000):
        events[row[0]].append({name: _plain(v) for name, v in zip(EVENT_COLUMNS, row[1:],
                                                                  strict=True)})
    creations = {c.run_id: row_fields(c)
                 for c in RunCreation.objects.using(using).filter(run_id__in=ids)}
    notifications: dict[int, list] = defaultdict(list)
    by_pk: dict[int, dict] = {}
    for note in Notification.objects.using(using).filter(
            approval_id__in=list(run_of)).order_by("pk"):
        by_pk[note.pk] = {**row_fields(note), "attempts": []}
        notifications[run_of[note.approval_id]].append(by_pk[note.pk])
    for attempt in NotificationAttempt.objects.using(using).filter(
            notification_id__in=list(by_pk)).order_by("notification_id", "number", "pk"):
        by_pk[attempt.notification_id]["attempts"].append(row_fields(attempt))
    return [{"run": row_fields(run), "creation": creations.get(run.pk),
             "steps": steps[run.pk], "approvals": approvals[run.pk], "events": events[run.pk],
             "notifications": notifications[run.pk]}
            for run in Run.objects.using(using).filter(pk__in=ids).order_by("pk")]


def archive_write(path: Path, header: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """Write the header and records to ``path`` (0600, whole: a temporary file synced, then
    renamed, then the directory synced); returns the file's SHA-256. A file of that name left
    by an interrupted prune is replaced."""
    return write_whole(path, ((json.dumps(item, separators=(",", ":"), allow_nan=False)
                               + "\n").encode() for item in (header, *records)),
                       temporary=path.with_name(f".{path.name}.tmp"))


def archive_load(path: Path) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """An archive file's SHA-256, header and records; ``ArchiveRefused`` says why not."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ArchiveRefused(str(path), f"{size} bytes is more than an archive holds")
        data = path.read_bytes()
    except OSError as exc:
        raise ArchiveRefused(str(path), exc.strerror or str(exc)) from None
    digest = hashlib.sha256(data).hexdigest()
    try:
        lines = [json.loads(line) for line in data.splitlines() if line.strip()]
    except (ValueError, RecursionError):
        raise ArchiveRefused(str(path), "not an archive of pruned runs (not JSON lines)") from None
    if not lines or not isinstance(lines[0], dict) or lines[0].get("format") != FORMAT:
        raise ArchiveRefused(str(path), "not an archive of pruned runs")
    if lines[0].get("version") != VERSION:
        raise ArchiveRefused(str(path), f"archive version {lines[0].get('version')!r} is not "
                             f"{VERSION}")
    records = lines[1:]
    if not all(isinstance(r, dict) and isinstance(r.get("run"), dict) for r in records):
        raise ArchiveRefused(str(path), "a line is not an archived run")
    return digest, lines[0], records
