"""Reads of schedules for people: the list with each schedule's latest runs, one schedule with
its runs and its history. Like ``runtime.selectors``, every read is bounded: a schedule that
has fired every minute for a year costs a page what a new one does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.db.models import OuterRef, Q, Subquery

from runtime.agents.agent import registry
from runtime.clock import SYSTEM_CLOCK
from runtime.effects import Effect
from runtime.models import Run, Schedule, ScheduleEvent

if TYPE_CHECKING:
    from typing import TypeAlias, TypedDict

    from django_stubs_ext import WithAnnotations

    class _RunsFrom(TypedDict):
        runs_from: datetime | None

    # A schedule from ``schedule_list``, with where its latest runs begin.
    ListedSchedule: TypeAlias = WithAnnotations[Schedule, _RunsFrom]

RECENT_RUNS = 5  # the runs of each schedule the list shows
RUN_FIELDS = ("id", "status", "failure_code", "schedule_id", "occurrence_at", "created_at")


@dataclass(frozen=True)
class ScheduleRow:
    """One schedule as a list shows it: its latest runs (newest occurrence first), when it
    fires next (None while disabled) and whether that moment is already past."""

    schedule: Schedule
    runs: list[Run]
    next_fire: datetime | None
    overdue: bool


def _runs_from() -> Subquery:
    """The occurrence of a schedule's ``RECENT_RUNS``-th latest run (NULL with fewer runs): one
    probe of the unique (schedule, occurrence_at) index per schedule listed."""
    return Subquery(Run.objects.filter(schedule_id=OuterRef("pk"))
                    .order_by("-occurrence_at").values("occurrence_at")
                    [RECENT_RUNS - 1: RECENT_RUNS])


def schedule_list(limit: int = 200, now: datetime | None = None
                  ) -> tuple[list[ScheduleRow], bool]:
    """The schedules not removed, by name, at most ``limit`` (and whether there are more),
    each with its latest ``RECENT_RUNS`` runs: two queries whatever the number of schedules
    or runs. The first reads the schedules and, for each, where its latest runs begin; the
    second reads exactly those runs, each schedule's a range of the (schedule, occurrence_at)
    index."""
    schedules = list(Schedule.objects.filter(removed_at__isnull=True)
                     .annotate(runs_from=_runs_from()).order_by("name", "pk")[: limit + 1])
    more = len(schedules) > limit
    schedules = schedules[:limit]
    runs = recent_runs(schedules)
    now = now or SYSTEM_CLOCK.now()
    return [ScheduleRow(s, runs[s.pk], schedule_next_fire(s), schedule_overdue(s, now))
            for s in schedules], more


def recent_runs(schedules: Sequence[ListedSchedule]) -> dict[int, list[Run]]:
    """The latest runs of each schedule (annotated ``runs_from`` by ``schedule_list``), newest
    occurrence first, in one query."""
    if not schedules:
        return {}
    wanted = Q()
    for s in schedules:
        range_ = Q(schedule_id=s.pk)
        if s.runs_from is not None:
            range_ &= Q(occurrence_at__gte=s.runs_from)
        wanted |= range_
    # No ORDER BY: with one, SQLite (given statistics) may prefer reading the whole index in
    # order to the index range per schedule; the few rows are sorted here instead.
    runs = sorted(Run.objects.filter(wanted).only(*RUN_FIELDS).order_by(),
                  key=lambda r: (r.occurrence_at is not None, r.occurrence_at, r.pk),
                  reverse=True)
    found: dict[int, list[Run]] = {s.pk: [] for s in schedules}
    for run in runs:
        assert run.schedule_id is not None, "read by schedule_id"
        rows = found[run.schedule_id]
        if len(rows) < RECENT_RUNS:
            rows.append(run)
    return found


def schedule_for_page(pk: int) -> Schedule | None:
    """One schedule that was not removed."""
    return Schedule.objects.filter(pk=pk, removed_at__isnull=True).first()


def schedule_runs(schedule_id: int, limit: int = 20) -> list[Run]:
    """A schedule's latest ``limit`` runs, newest occurrence first (the unique index)."""
    return list(Run.objects.filter(schedule_id=schedule_id).only(*RUN_FIELDS)
                .order_by("-occurrence_at", "-pk")[:limit])


def schedule_events(schedule: Schedule, limit: int = 50) -> tuple[list[ScheduleEvent], int]:
    """A schedule's latest ``limit`` changes, newest first, and how many there are in all
    (its chain head)."""
    rows = list(ScheduleEvent.objects.filter(schedule_id=schedule.pk)
                .order_by("-seq")[:limit])
    return rows, schedule.event_seq


def schedule_version(schedule: Schedule) -> str:
    """Changes whenever the schedule is changed by a person (each change appends to its
    chain): a form shown at one version is stale at the next."""
    return str(schedule.event_seq)


def schedule_next_fire(schedule: Schedule) -> datetime | None:
    """When the schedule fires next: None while it is disabled (enabling it starts from the
    first occurrence after that moment; nothing missed is fired)."""
    return schedule.next_fire_at if schedule.enabled else None


def schedule_overdue(schedule: Schedule, now: datetime | None = None) -> bool:
    """Whether an enabled schedule's next occurrence is past: no worker has fired it yet."""
    nxt = schedule_next_fire(schedule)
    return nxt is not None and nxt <= (now or SYSTEM_CLOCK.now())


def agent_side_effect_tools(agent: str) -> list[str] | None:
    """The tools of ``agent`` declared ``side_effect`` (what a standing authorization may let
    through), sorted; None when no agent of that name is configured here."""
    found = registry.all().get(agent)
    if found is None:
        return None
    return sorted(name for name, t in found.tools.items() if t.effect == Effect.SIDE_EFFECT)
