"""Schedules: runs created on a cron expression or an interval, and their standing authorization.

Every change to a schedule (created, edited, enabled or disabled, authorization on or off,
removed) is an event of the schedule's own hash chain, written in the same transaction, with
the person and the old and new values. Workers fire due occurrences: each occurrence is one
compare-and-set of the schedule's ``next_fire_at`` from that occurrence to the next, in the
transaction that creates its run, and the run's (schedule, occurrence) is unique, so however
many workers race, one occurrence makes one run.

Missed occurrences (no worker ran) are fired once: the latest one due, with the number of
earlier ones skipped recorded on the run's ``run.created`` event; the next fire time is then
the first occurrence after now. Cron expressions are read in the schedule's time zone (a
02:30 that a spring-forward skips fires at 03:00; an hour repeated in autumn fires a daily
schedule once).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import JSONField, Value

from runtime.agents.agent import get_agent
from runtime.canonical import chain_hash, check_payload, dumps, iso_time, iso_time_or_none
from runtime.errors import InvalidPayload, InvalidSchedule, ScheduleNotFound, UnknownAgent
from runtime.models import Schedule, ScheduleEvent
from runtime.schedules.timing import schedule_timing, timing

log = logging.getLogger("runtime.schedules")

EDITABLE = ("agent", "input", "cron", "interval_seconds", "timezone")


# -- the schedule's own audit chain ----------------------------------------------------------


def schedule_event_hash(prev: str, *, schedule_id: int, seq: int, kind: str, payload: Any,
                        actor: str, at: datetime) -> str:
    body = dumps({"schedule": schedule_id, "seq": seq, "kind": kind, "payload": payload,
                  "actor": actor, "at": iso_time(at)})
    return chain_hash(prev, body)


def _append_in_tx(schedule: Schedule, kind: str, payload: dict[str, Any], actor: str,
                  at: datetime) -> None:
    """Append one event to the schedule's chain and move its head (a compare-and-set on the
    head, so two edits at once cannot both chain after the same event)."""
    seq = schedule.event_seq + 1
    digest = schedule_event_hash(schedule.event_hash, schedule_id=schedule.pk, seq=seq,
                                 kind=kind, payload=payload, actor=actor, at=at)
    moved = Schedule.objects.filter(pk=schedule.pk, event_seq=schedule.event_seq).update(
        event_seq=seq, event_hash=digest)
    if moved != 1:
        raise InvalidSchedule("schedule", "changed by someone else meanwhile; try again")
    ScheduleEvent.objects.create(schedule_id=schedule.pk, seq=seq, kind=kind, payload=payload,
                                 actor=actor, at=at, hash=digest)
    schedule.event_seq, schedule.event_hash = seq, digest


def _check_agent_and_input(agent: str, input: Any) -> Any:
    try:
        get_agent(agent)
    except UnknownAgent as exc:
        raise InvalidSchedule("agent", str(exc)) from None
    try:
        return check_payload("schedule input", input)
    except InvalidPayload as exc:
        raise InvalidSchedule("input", str(exc)) from None


# -- changes, each with its event --------------------------------------------------------------


def schedule_create(name: str, agent: str, input: Any, *, by: str, now: datetime,
                    cron: str = "", interval_seconds: int | None = None,
                    timezone: str = "UTC", enabled: bool = True) -> Schedule:
    """A new schedule (its first occurrence is the first after ``now``); ``schedule.created``
    records every field. Standing authorization starts off: it is turned on on its own."""
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise InvalidSchedule("name", "a name of 1 to 100 characters is needed")
    if not by:
        raise InvalidSchedule("by", "a change needs the name of who made it")
    when = timing(cron, interval_seconds, timezone)
    data = _check_agent_and_input(agent, input)
    try:
        with transaction.atomic():
            schedule = Schedule.objects.create(
                name=name, agent=agent, input=_stored(data), cron=when.cron,
                interval_seconds=when.interval_seconds, timezone=timezone, enabled=enabled,
                next_fire_at=when.after(now), created_by=by, created_at=now, updated_at=now)
            _append_in_tx(schedule, "schedule.created", {
                "name": name, "agent": agent, "input": data, "cron": when.cron,
                "interval_seconds": when.interval_seconds, "timezone": timezone,
                "enabled": enabled,
                "next_fire_at": iso_time_or_none(schedule.next_fire_at)}, by, now)
    except IntegrityError:
        if not Schedule.objects.filter(name=name).exists():
            raise
        raise InvalidSchedule("name", f"a schedule named {name!r} exists") from None
    schedule.input = data
    return schedule


def _stored(data: Any) -> Any:
    """JSON null is a valid input: stored as JSON, not as SQL NULL (which the column refuses)."""
    return Value(None, JSONField()) if data is None else data


def _locked(schedule_id: int) -> Schedule:
    schedule = Schedule.objects.select_for_update().filter(
        pk=schedule_id, removed_at__isnull=True).first()
    if schedule is None:
        raise ScheduleNotFound(schedule_id)
    return schedule


def schedule_update(schedule_id: int, *, by: str, now: datetime, **changes: Any) -> Schedule:
    """Change what and when a schedule runs (``EDITABLE`` fields); ``schedule.updated`` holds
    each changed field's old and new value. A new timing starts from ``now``."""
    unknown = set(changes) - set(EDITABLE)
    if unknown:
        raise InvalidSchedule(sorted(unknown)[0], "cannot be changed this way")
    if not by:
        raise InvalidSchedule("by", "a change needs the name of who made it")
    with transaction.atomic():
        schedule = _locked(schedule_id)
        new = {f: changes.get(f, getattr(schedule, f)) for f in EDITABLE}
        when = timing(new["cron"], new["interval_seconds"], new["timezone"])
        new["cron"], new["interval_seconds"] = when.cron, when.interval_seconds
        new["input"] = _check_agent_and_input(new["agent"], new["input"])
        diff = {f: {"old": getattr(schedule, f), "new": new[f]} for f in EDITABLE
                if dumps(getattr(schedule, f)) != dumps(new[f])}
        if not diff:
            return schedule
        if {"cron", "interval_seconds", "timezone"} & diff.keys():
            old_next = schedule.next_fire_at
            schedule.next_fire_at = when.after(now)
            diff["next_fire_at"] = {"old": iso_time_or_none(old_next),
                                    "new": iso_time_or_none(schedule.next_fire_at)}
        for f in EDITABLE:
            setattr(schedule, f, _stored(new[f]) if f == "input" else new[f])
        schedule.updated_at = now
        # The authorization was given for this agent and this input: another one needs it
        # given again, by someone who sees what it now covers.
        revoke = schedule.authorize_side_effects and bool({"agent", "input"} & diff.keys())
        if revoke:
            schedule.authorize_side_effects = False
        schedule.save(update_fields=[*EDITABLE, "next_fire_at", "updated_at",
                                     "authorize_side_effects"])
        schedule.input = new["input"]
        _append_in_tx(schedule, "schedule.updated", {"changes": diff}, by, now)
        if revoke:
            at = iso_time_or_none(schedule.authorized_at)
            _append_in_tx(schedule, "schedule.unauthorized", {
                "authorize_side_effects": {
                    "old": {"on": True, "by": schedule.authorized_by, "at": at},
                    "new": {"on": False, "by": schedule.authorized_by, "at": at}},
                "agent": schedule.agent, "reason": "agent or input changed"}, by, now)
    return schedule


def schedule_set_enabled(schedule_id: int, enabled: bool, *, by: str, now: datetime) -> Schedule:
    """Enable (from the first occurrence after now: nothing missed is fired) or disable."""
    if not by:
        raise InvalidSchedule("by", "a change needs the name of who made it")
    with transaction.atomic():
        schedule = _locked(schedule_id)
        if schedule.enabled == enabled:
            return schedule
        old_next = schedule.next_fire_at
        if enabled:
            schedule.next_fire_at = schedule_timing(schedule).after(now)
        schedule.enabled, schedule.updated_at = enabled, now
        schedule.save(update_fields=["enabled", "next_fire_at", "updated_at"])
        _append_in_tx(schedule, "schedule.enabled" if enabled else "schedule.disabled", {
            "enabled": {"old": not enabled, "new": enabled},
            "next_fire_at": {"old": iso_time_or_none(old_next),
                             "new": iso_time_or_none(schedule.next_fire_at)}},
            by, now)
    return schedule


def schedule_authorize(schedule_id: int, on: bool, *, by: str, now: datetime) -> Schedule:
    """Turn the standing authorization on (recording who and when: policy approvals of runs
    fired from now on are granted without a person) or off (runs not yet at that step ask a
    person again)."""
    if not by:
        raise InvalidSchedule("by", "a change needs the name of who made it")
    with transaction.atomic():
        schedule = _locked(schedule_id)
        if schedule.authorize_side_effects == on:
            return schedule
        old = {"on": schedule.authorize_side_effects, "by": schedule.authorized_by,
               "at": iso_time_or_none(schedule.authorized_at)}
        schedule.authorize_side_effects, schedule.updated_at = on, now
        if on:
            schedule.authorized_by, schedule.authorized_at = by, now
        schedule.save(update_fields=["authorize_side_effects", "authorized_by", "authorized_at",
                                     "updated_at"])
        new = {"on": on, "by": schedule.authorized_by,
               "at": iso_time_or_none(schedule.authorized_at)}
        _append_in_tx(schedule, "schedule.authorized" if on else "schedule.unauthorized",
                      {"authorize_side_effects": {"old": old, "new": new},
                       "agent": schedule.agent}, by, now)
    return schedule


# -- firing -----------------------------------------------------------------------------------


# -- the standing authorization at a step ----------------------------------------------------


def schedule_remove(schedule_id: int, *, by: str, now: datetime) -> Schedule:
    """Stop a schedule for good and drop it from the lists; it stays in the database, because
    its runs and its events refer to it."""
    if not by:
        raise InvalidSchedule("by", "a change needs the name of who made it")
    with transaction.atomic():
        schedule = _locked(schedule_id)  # a removed one is not found
        was = schedule.enabled
        schedule.enabled, schedule.removed_at, schedule.updated_at = False, now, now
        schedule.save(update_fields=["enabled", "removed_at", "updated_at"])
        _append_in_tx(schedule, "schedule.removed", {"enabled": {"old": was, "new": False}},
                      by, now)
    return schedule
