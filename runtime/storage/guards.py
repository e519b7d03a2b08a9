"""Conditions a commit holds inside its own transaction besides its fence (``Plan.standing``)."""

from __future__ import annotations

from runtime.models import Schedule
from runtime.storage.base import Refused
from runtime.storage.plan import Plan

STANDING_WITHDRAWN = "standing authorization withdrawn"


def standing_check_in_tx(plan: Plan, *, lock: bool) -> None:
    """Refuse the commit unless the schedule still holds the standing authorization the plan
    started under (on, the same grant, the schedule enabled and not removed). ``lock`` takes
    the schedule row, so a change to it waits for this commit (PostgreSQL); on SQLite the
    write lock the transaction holds already keeps every writer out."""
    guard = plan.standing
    if guard is None:
        return
    found = Schedule.objects.filter(pk=guard.schedule_id, authorize_side_effects=True,
                                    authorized_at=guard.authorized_at, enabled=True,
                                    removed_at__isnull=True)
    if lock:
        found = found.select_for_update()
    if not list(found.values_list("pk", flat=True)[:1]):
        raise Refused(STANDING_WITHDRAWN)
