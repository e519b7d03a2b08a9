"""``verifyaudit``'s check of the schedules: each one's chain of events, and its row replayed
from them (who authorized side effects, and when, is what an auditor asks first).

Not replayed: ``next_fire_at`` (firing moves it without an event; each firing is on its run's
``run.created`` instead) and ``updated_at``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from runtime.canonical import dumps, parse_time
from runtime.models import Schedule, ScheduleEvent
from runtime.schedules.changes import schedule_event_hash

FIELDS = ("name", "agent", "input", "cron", "interval_seconds", "timezone", "enabled",
          "authorize_side_effects", "authorized_by", "authorized_at", "removed_at",
          "created_by", "created_at")


def _replay(events: list[Any]) -> dict[str, Any]:
    state: dict[str, Any] = {"authorize_side_effects": False, "authorized_by": "",
                             "authorized_at": None, "removed_at": None}
    for e in events:
        p = e.payload
        if e.kind == "schedule.created":
            state.update({f: p.get(f) for f in ("name", "agent", "input", "cron",
                                                "interval_seconds", "timezone", "enabled")})
            state["created_by"], state["created_at"] = e.actor, e.at
        elif e.kind == "schedule.updated":
            state.update({f: change.get("new") for f, change in p.get("changes", {}).items()
                          if f != "next_fire_at"})
        elif e.kind in ("schedule.enabled", "schedule.disabled"):
            state["enabled"] = e.kind == "schedule.enabled"
        elif e.kind in ("schedule.authorized", "schedule.unauthorized"):
            new = p.get("authorize_side_effects", {}).get("new", {})
            state["authorize_side_effects"] = bool(new.get("on"))
            state["authorized_by"], state["authorized_at"] = new.get("by", ""), parse_time(
                new.get("at"))
        elif e.kind == "schedule.removed":
            state["enabled"], state["removed_at"] = False, e.at
    return state


def schedules_problems(using: str = "default") -> Iterator[str]:
    """Every schedule whose chain is broken or whose row differs from its events."""

    for schedule in Schedule.objects.using(using).order_by("pk").iterator(chunk_size=500):
        where = f"schedule {schedule.pk} ({schedule.name})"
        events = list(ScheduleEvent.objects.using(using).filter(schedule_id=schedule.pk)
                      .order_by("seq"))
        head, broken = "", False
        for n, e in enumerate(events, start=1):
            want = schedule_event_hash(head, schedule_id=schedule.pk, seq=e.seq, kind=e.kind,
                                       payload=e.payload, actor=e.actor, at=e.at)
            if e.seq != n or want != e.hash:
                yield f"{where}: its chain breaks at event #{n} ({e.kind}): altered or removed"
                broken = True
                break
            head = e.hash
        if broken:
            continue
        if (schedule.event_seq, schedule.event_hash) != (len(events), head):
            yield (f"{where}: records head #{schedule.event_seq}, its events end at "
                   f"#{len(events)} (events missing or added)")
            continue
        state = _replay(events)
        for name in FIELDS:
            recorded, expected = getattr(schedule, name), state.get(name)
            if name == "input":
                recorded, expected = dumps(recorded), dumps(expected)
            if recorded != expected:
                yield (f"{where}: {name} is {recorded!r} in the row; its events give "
                       f"{expected!r}")
