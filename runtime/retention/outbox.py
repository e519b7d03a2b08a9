"""Retention of the outbox: notifications delivered (or given up) long ago, and their attempts.

They are not audit records (the approval's own events say what was asked and decided), so they
are simply deleted, in small transactions. A notification still pending is never touched,
whatever its age: the workers are still delivering it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction

from runtime.conf import setting
from runtime.errors import PruneRefused
from runtime.models import Notification, NotificationAttempt, NotificationStatus
from runtime.retention.totals import FAILED_ATTEMPTS, failed_attempts, retire_in_tx

_DONE = (NotificationStatus.DELIVERED, NotificationStatus.FAILED)


def notifications_retention_cutoff(now: datetime) -> datetime | None:
    """``now`` less ``RUNTIME_RETAIN_NOTIFICATIONS_DAYS``; None when they are kept for ever."""
    days = int(setting("RETAIN_NOTIFICATIONS_DAYS") or 0)
    return now - timedelta(days=days) if days else None


def notifications_prune(*, before: datetime, now: datetime, batch: int = 500,
                        using: str = "default") -> tuple[int, int]:
    """Delete notifications created before ``before`` that were delivered or given up, with
    their attempts, ``batch`` per transaction; returns (notifications, attempts) deleted."""
    if before.tzinfo is None:
        raise PruneRefused("the date has no time zone")
    if before > now:
        raise PruneRefused(f"{before.isoformat()} is in the future")
    notes = attempts = 0
    cursor = 0
    while True:
        ids = list(Notification.objects.using(using).filter(
            status__in=_DONE, created_at__lt=before, pk__gt=cursor,
        ).order_by("pk").values_list("pk", flat=True)[:batch])
        if not ids:
            return notes, attempts
        with transaction.atomic(using=using):
            going = NotificationAttempt.objects.using(using).filter(
                notification_id__in=ids, notification__status__in=_DONE)
            retire_in_tx({FAILED_ATTEMPTS: failed_attempts(going)}, using)
            attempts += going.delete()[0]
            notes += Notification.objects.using(using).filter(
                pk__in=ids, status__in=_DONE).delete()[0]
        cursor = ids[-1]
