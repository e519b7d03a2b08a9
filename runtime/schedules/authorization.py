"""The standing authorization: a scheduled run's policy approvals granted by the person who
authorized its schedule (design §10)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from runtime.canonical import iso_time_or_none
from runtime.models import Run, Schedule
from runtime.schedules.timing import schedule_timing


def standing_authorization(run: Run, now: datetime) -> dict[str, Any] | None:
    """What authorizes the run's policy approval without a person, or None.

    Only a run an occurrence created, whose schedule had the authorization on at the moment
    of firing and still has that same authorization on (not turned off, not turned off and on
    again since), and only while the run is not a leftover: its occurrence is at most one
    period old. It is asked only for a first start a policy wants approved; an interrupted
    side effect never gets here (section 7 decides those)."""
    if run.schedule_id is None or run.occurrence_at is None or run.authorized_at is None:
        return None
    schedule = Schedule.objects.filter(pk=run.schedule_id).first()
    if schedule is None or not schedule.authorize_side_effects:
        return None
    if not schedule.enabled or schedule.removed_at is not None:  # stopped: ask a person
        return None
    if schedule.authorized_at != run.authorized_at:
        return None
    if now - run.occurrence_at > schedule_timing(schedule).period(run.occurrence_at):
        return None
    return {"schedule_id": schedule.pk, "schedule": schedule.name,
            "occurrence": iso_time_or_none(run.occurrence_at),
            "authorized_by": schedule.authorized_by,
            "authorized_at": iso_time_or_none(schedule.authorized_at)}
