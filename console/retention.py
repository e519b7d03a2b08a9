"""Retention of the console's own rows: the answers kept for ``Idempotency-Key`` requests, and
API tokens nobody has used for long (``manage.py pruneapi``).

Neither is an audit record (a decision taken through the API is in the run's events, with the
person's name), so both are deleted, in small transactions. An answer still being given
(``status`` 0, younger than the abandoned-reservation limit) is never touched: its request is
in flight.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q, QuerySet

from console.api.idempotency import ABANDONED_AFTER
from console.models import ApiToken, IdempotentRequest
from runtime import conf

BATCH = 500


def retention_cutoff(variable: str, now: datetime) -> datetime | None:
    """``now`` less the days ``variable`` (``CONSOLE_RETAIN_...``) keeps; None: kept for ever."""
    days = int(conf.value(variable) or 0)
    return now - timedelta(days=days) if days else None


def idempotency_prune(*, before: datetime, now: datetime) -> int:
    """Delete the kept answers of requests made before ``before``; returns how many."""
    before = min(before, now - ABANDONED_AFTER)  # never a reservation whose request is live
    return _delete_in_batches(IdempotentRequest.objects.filter(created_at__lt=before))


def tokens_prune(*, unused_since: datetime) -> int:
    """Delete API tokens neither issued, used nor revoked since ``unused_since`` (a token never
    used counts from its issue); returns how many. Their holders get 401 from then on."""
    idle = (Q(created_at__lt=unused_since)
            & (Q(last_used_at__isnull=True) | Q(last_used_at__lt=unused_since))
            & (Q(revoked_at__isnull=True) | Q(revoked_at__lt=unused_since)))
    return _delete_in_batches(ApiToken.objects.filter(idle))


def _delete_in_batches(rows: QuerySet) -> int:
    deleted = 0
    while True:
        ids = list(rows.order_by("pk").values_list("pk", flat=True)[:BATCH])
        if not ids:
            return deleted
        with transaction.atomic():
            deleted += rows.filter(pk__in=ids).delete()[0]
