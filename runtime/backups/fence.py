"""The restore fence: what a restored database holds so that no side effect runs again unasked.

Every run not finished at the backup's moment may have done more after it. Each is handed back
to the queue with ``restored_at`` set (its event ``run.restored`` says from which backup), its
open approvals cancelled (a decision taken before the restore may have been acted on after
it), and its lease cleared. From then on the loop (``runtime.loop.execution``) puts each of the
run's side effects, new or interrupted, to a person as a ``restored`` approval, and trusts no
proof of non-dispatch recorded before the restore. One transaction: all of it or none.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from runtime.canonical import iso_time, iso_time_or_none
from runtime.clock import SYSTEM_CLOCK
from runtime.errors import RestoreRefused
from runtime.models import (
    TERMINAL_RUN_STATUSES,
    Approval,
    ApprovalStatus,
    Backup,
    Restoration,
    Run,
    RunStatus,
    Worker,
)
from runtime.storage.base import Refused
from runtime.storage.engines import engine, notify_ready
from runtime.storage.events import log_events
from runtime.storage.plan import Fence, Plan

OPEN_APPROVALS = (ApprovalStatus.PENDING, ApprovalStatus.APPROVED)


def backup_moment(using: str = "default") -> datetime | None:
    """When the newest backup recorded in this database began: a restored copy holds the row
    its own backup wrote, so this is the moment its data is from (or a little before)."""
    return (Backup.objects.using(using).order_by("-taken_at", "-pk")
            .values_list("taken_at", flat=True).first())


def restore_fence(*, by: str, now: datetime | None = None, taken_at: datetime | None = None,
                  checkpoint_at: datetime | None = None) -> Restoration:
    """Fence this (just restored) database: record the restoration, forget the workers of before
    and hold every unfinished run from the backup's moment ``taken_at`` (default: the newest
    backup the database records). ``RestoreRefused`` when that moment is unknown."""
    now = now or SYSTEM_CLOCK.now()
    taken_at = taken_at or backup_moment()
    if taken_at is None:
        raise RestoreRefused("", "this database records no backup, so the moment its data is "
                             "from is unknown; give it (--taken-at) from the backup's name or "
                             "log")
    eng = engine()
    committed: list[Any] = []
    try:
        with transaction.atomic():  # the ORM's bookkeeping is no cost here: a restore is rare
            restoration = Restoration.objects.create(at=now, by=by, backup_taken_at=taken_at,
                                                     checkpoint_at=checkpoint_at)
            Worker.objects.all().delete()  # the processes the backup knew are not ours
            runs = Run.objects.exclude(status__in=TERMINAL_RUN_STATUSES).order_by("pk")
            for run in list(runs):
                plan = _hold(run, restoration, now, by)
                committed.append(eng.apply_in_tx(plan, SYSTEM_CLOCK))
            held = len(committed)
            Restoration.objects.filter(pk=restoration.pk).update(runs_held=held)
    except Refused as exc:
        raise fence_refused(exc) from None
    for one in committed:
        log_events(one.rows)
    if held:
        notify_ready()
    restoration.runs_held = held
    return restoration


def _hold(run: Run, restoration: Restoration, now: datetime, by: str) -> Plan:
    plan = Plan(run_id=run.pk, at=now, actor=by, head=run.event_hash,
                fence=Fence(seq=run.event_seq, status=(run.status,)))
    for a in Approval.objects.filter(run_id=run.pk, status__in=OPEN_APPROVALS).select_related(
            "step"):
        plan.event("approval.cancelled", {
            "approval_id": a.pk, "reason": "the database was restored from a backup: this "
            "decision may have been acted on after the backup's moment"}, a.step.index)
        plan.approval_move(a.pk, a.status, status=ApprovalStatus.CANCELLED)
    plan.event("run.restored", {
        "backup_taken_at": iso_time(restoration.backup_taken_at), "restoration": restoration.pk,
        "was": run.status, "previous_owner": run.lease_owner,
        "restored_at": iso_time(now), "checkpoint_at": iso_time_or_none(
            restoration.checkpoint_at)})
    plan.run.update(status=RunStatus.QUEUED, restored_at=restoration.backup_taken_at,
                    lease_owner="", lease_expires_at=None)
    return plan


def fence_refused(exc: Refused) -> RestoreRefused:
    """A run changed under the fence (a worker was running after all)."""
    return RestoreRefused("", f"a run changed while the database was being fenced ({exc}): "
                          "stop every worker and run the restore again")
