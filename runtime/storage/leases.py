"""When a lease is gone: the one rule, as SQL and as a query expression."""

from __future__ import annotations

from typing import Any

from django.db.models import BooleanField, ExpressionWrapper, Q

from runtime.storage.engines import engine


def now_expression(clock: Any) -> Any:
    """The time a lease is judged by, as a query expression (the server's clock, or
    ``clock``'s value read now)."""
    return engine().now_expression(clock)


def lease_expired(clock: Any) -> ExpressionWrapper:
    """Whether a run's lease is gone (none, or past its expiry) by the database's time, as a
    query expression: claims, the landed check and the diagnosis all judge it this one way."""
    return ExpressionWrapper(
        Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now_expression(clock)),
        output_field=BooleanField())
