"""When a schedule fires: a cron expression in a time zone, or a fixed interval."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from runtime.errors import InvalidSchedule
from runtime.models import Schedule

CRON_ALIASES = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight",
                          "@hourly"})


MIN_INTERVAL_SECONDS = 1


MAX_INTERVAL_SECONDS = 366 * 24 * 3600


MAX_SKIPPED_COUNTED = 10_000  # past this, "at least" (counting a year of minutes costs seconds)


@dataclass(frozen=True)
class Timing:
    """When a schedule fires: a cron expression in a zone, or a fixed interval."""

    cron: str
    interval_seconds: int | None
    zone: ZoneInfo

    def after(self, at: datetime) -> datetime:
        """The first occurrence strictly after ``at`` (UTC). In an hour that autumn repeats,
        a cron with a fixed hour fires in the first pass only (a daily 02:30 once); one whose
        hour is ``*`` fires in both, which are different instants."""
        if self.interval_seconds:
            return at + timedelta(seconds=self.interval_seconds)
        it = croniter(self.cron, at.astimezone(self.zone))
        every_hour = croniter(self.cron).expanded[1] == ["*"]
        while True:
            nxt = it.get_next(datetime)
            if every_hour or not nxt.fold:
                return nxt.astimezone(UTC)

    def period(self, occurrence: datetime) -> timedelta:
        """How long until the occurrence after ``occurrence``: a run older than this is a
        leftover of an earlier firing."""
        return self.after(occurrence) - occurrence

    def due(self, first: datetime, now: datetime) -> tuple[datetime, datetime, int]:
        """For a schedule due at ``first`` (<= now): the occurrence to fire (the latest one
        due), the next fire time (the first after now) and how many were skipped."""
        if self.interval_seconds:
            missed = int((now - first).total_seconds() // self.interval_seconds)
            latest = first + timedelta(seconds=missed * self.interval_seconds)
            return latest, latest + timedelta(seconds=self.interval_seconds), missed
        latest, skipped = first, 0
        nxt = self.after(latest)
        while nxt <= now:
            if skipped >= MAX_SKIPPED_COUNTED:  # jump: counting further costs more than it says
                latest = croniter(self.cron, now.astimezone(self.zone)).get_prev(
                    datetime).astimezone(UTC)
                if self.after(latest) <= now:  # get_prev skips a slot exactly at now
                    latest = self.after(latest)
                nxt = self.after(now)
                break
            latest, skipped = nxt, skipped + 1
            nxt = self.after(latest)
        return latest, nxt, skipped


def timing(cron: str, interval_seconds: int | None, timezone: str) -> Timing:
    """Validate when a schedule fires; ``InvalidSchedule`` names the (first) field."""
    problems = timing_problems(cron, interval_seconds, timezone)
    if problems:
        raise problems[0]
    cron = (cron or "").strip()
    return Timing(cron, None if cron else interval_seconds, ZoneInfo(timezone))


def timing_problems(cron: str, interval_seconds: int | None,
                    timezone: str) -> list[InvalidSchedule]:
    """Everything wrong with when a schedule fires, each naming its field, so a form can show
    every problem at once (an empty list: ``timing`` accepts these)."""
    problems = []
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        problems.append(InvalidSchedule("timezone", f"{timezone!r} is not a time zone name "
                                        "(e.g. UTC, Europe/Berlin)"))
    cron = (cron or "").strip()
    if bool(cron) == (interval_seconds is not None):
        problems.append(InvalidSchedule("cron", "give either a cron expression or an interval, "
                                        "not both and not neither"))
    if cron:
        if len(cron) > 100:
            problems.append(InvalidSchedule("cron", "longer than 100 characters"))
        elif not (cron.lower() in CRON_ALIASES or len(cron.split()) == 5) \
                or not croniter.is_valid(cron):
            problems.append(InvalidSchedule(
                "cron", f"{cron!r} is not a cron expression of five fields (minute hour day "
                "month weekday) or one of " + ", ".join(sorted(CRON_ALIASES))))
    if interval_seconds is not None and (
            isinstance(interval_seconds, bool) or not isinstance(interval_seconds, int)
            or not MIN_INTERVAL_SECONDS <= interval_seconds <= MAX_INTERVAL_SECONDS):
        problems.append(InvalidSchedule("interval_seconds", f"an interval is a whole number of "
                                        f"seconds from {MIN_INTERVAL_SECONDS} to "
                                        f"{MAX_INTERVAL_SECONDS}"))
    return problems


def schedule_timing(schedule: Schedule) -> Timing:
    return timing(schedule.cron, schedule.interval_seconds, schedule.timezone)
