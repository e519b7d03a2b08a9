"""Firing schedules: each due occurrence creates one run, however many workers race for it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.db import transaction

from runtime.agents.agent import get_agent
from runtime.canonical import iso_time
from runtime.errors import InvalidPayload, UnknownAgent
from runtime.models import Restoration, Schedule
from runtime.schedules.changes import _append_in_tx, log
from runtime.schedules.timing import schedule_timing
from runtime.storage.runs import run_create_in_tx


def schedules_fire_due(now: datetime, *, limit: int = 50, only: list[int] | None = None,
                       agents: Sequence[str] | None = None) -> list[int]:
    """Fire every due occurrence (at most ``limit`` schedules; ``only`` these ids, if given;
    with ``agents``, only schedules of those: a worker fires only what it could run, so one of
    an older release leaves a new agent's occurrences to a worker that has it); the ids of the
    runs this call created. An occurrence another worker fired first is simply not fired
    here."""

    query = Schedule.objects.filter(enabled=True, next_fire_at__lte=now)
    if only is not None:
        query = query.filter(pk__in=only)
    if agents is not None:
        query = query.filter(agent__in=list(agents))
    due = list(query.order_by("next_fire_at")[:limit])
    created = []
    for schedule in due:
        when = schedule_timing(schedule)
        assert schedule.next_fire_at is not None, "selected by next_fire_at <= now"
        occurrence, nxt, skipped = when.due(schedule.next_fire_at, now)
        try:
            get_agent(schedule.agent)
        except UnknownAgent:
            agent_known = False
        else:
            agent_known = True
        with transaction.atomic():
            claimed = Schedule.objects.filter(
                pk=schedule.pk, enabled=True, next_fire_at=schedule.next_fire_at).update(
                next_fire_at=nxt)
            if claimed != 1:
                continue  # another worker fired it, or someone changed the schedule meanwhile
            schedule.refresh_from_db()  # what it runs as of the claim (an edit may have landed)
            if not agent_known:
                log.warning("schedule %s: agent %r is not registered here; occurrence %s not "
                            "fired", schedule.name, schedule.agent, occurrence.isoformat())
                _append_in_tx(schedule, "schedule.missed", {
                    "occurrence": iso_time(occurrence),
                    "reason": f"unknown agent {schedule.agent}"},
                    "system", now)
                continue
            authorized = schedule.authorized_at if schedule.authorize_side_effects else None
            lost = _restored_since(occurrence)
            try:
                with transaction.atomic():  # a savepoint: a refused input leaves the claim
                    run = run_create_in_tx(
                        schedule.agent, schedule.input, created_by=f"schedule:{schedule.name}",
                        now=now, actor=f"schedule:{schedule.name}", origin={
                            "schedule": schedule, "occurrence_at": occurrence,
                            "skipped": skipped, "authorized_at": authorized,
                            "restored_at": lost})
            except InvalidPayload as exc:  # e.g. the size limit was lowered since
                log.warning("schedule %s: occurrence %s not fired: %s", schedule.name,
                            occurrence.isoformat(), exc)
                _append_in_tx(schedule, "schedule.missed", {
                    "occurrence": iso_time(occurrence), "reason": str(exc)}, "system", now)
                continue
            created.append(run.pk)
    return created


def _restored_since(occurrence: datetime) -> datetime | None:
    """The backup's moment, when a restore came after ``occurrence`` from a backup taken before
    it: the occurrence may have fired (and its run acted) in the timeline that restore lost."""
    return (Restoration.objects.filter(backup_taken_at__lt=occurrence, at__gte=occurrence)
            .order_by("-pk").values_list("backup_taken_at", flat=True).first())
