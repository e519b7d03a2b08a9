"""Creating a run: its row, its run.created event and its entry in the global audit chain, in one
transaction."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from django.db import (
    transaction,
)
from django.db.models import JSONField, Value

from runtime.canonical import check_payload, iso_time, iso_time_or_none
from runtime.models import Run, RunStatus
from runtime.storage.creations import run_creation_append_in_tx
from runtime.storage.engines import notify_ready
from runtime.storage.events import EventSpec, build_events, insert_events, log_events

if TYPE_CHECKING:
    from typing import TypeAlias, TypedDict

    from django_stubs_ext import WithAnnotations

    from runtime.storage.events import EventRow

    class _Created(TypedDict):
        created_rows: list[EventRow]  # its first events, for ``run_create`` to log

    CreatedRun: TypeAlias = WithAnnotations[Run, _Created]


def run_create(
    agent: str, input: Any, *, created_by: str = "", now: datetime, actor: str = ""
) -> Run:
    """Insert a queued run with its ``run.created`` event and its entry in the global audit
    chain. The caller checked the agent."""
    with transaction.atomic():
        run = run_create_in_tx(agent, input, created_by=created_by, now=now, actor=actor)
    log_events(run.created_rows)
    return run


def run_create_in_tx(agent: str, input: Any, *, created_by: str = "", now: datetime,
                     actor: str = "", origin: dict[str, Any] | None = None) -> CreatedRun:
    """``run_create`` inside the caller's transaction. ``origin`` names the schedule
    occurrence that creates the run (schedule, occurrence_at, skipped, authorized_at, and
    restored_at when a restore may have lost its first firing): kept on the run and in its
    ``run.created`` event."""
    data = check_payload("run input", input)
    extra: dict[str, Any] = {}
    payload: dict[str, Any] = {"agent": agent, "input": data, "created_by": created_by}
    if origin is not None:
        schedule = origin["schedule"]
        extra = {"schedule_id": schedule.pk, "occurrence_at": origin["occurrence_at"],
                 "authorized_at": origin["authorized_at"]}
        payload["schedule"] = {
            "id": schedule.pk, "name": schedule.name,
            "occurrence": iso_time(origin["occurrence_at"]),
            "skipped": origin["skipped"],
            "authorized_at": iso_time_or_none(origin["authorized_at"]),
            "authorized_by": schedule.authorized_by if origin["authorized_at"] else ""}
        if origin.get("restored_at") is not None:
            # An occurrence due before a restore may have fired in the timeline the restore
            # lost: its run is held like every run unfinished at the backup (design §12b).
            extra["restored_at"] = origin["restored_at"]
            payload["restored_at"] = iso_time(origin["restored_at"])
    # JSON null is a valid input: stored as JSON, not as SQL NULL (which the column refuses).
    stored = Value(None, JSONField()) if data is None else data
    run = cast("CreatedRun", Run.objects.create(
        agent=agent, input=stored, status=RunStatus.QUEUED, created_by=created_by,
        created_at=now, updated_at=now, **extra))
    run.input = data
    spec = EventSpec("run.created", payload)
    rows, seq, head = build_events(run.pk, 0, "", [spec], actor or created_by or "system", now)
    insert_events(rows)
    Run.objects.filter(pk=run.pk).update(event_seq=seq, event_hash=head)
    run_creation_append_in_tx(run.pk, agent, created_by, now, head)
    transaction.on_commit(notify_ready)
    run.event_seq, run.event_hash = seq, head
    run.created_rows = rows
    return run
