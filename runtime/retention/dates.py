"""The dates retention commands take: ``2026-01-31``, an ISO time, or ``90d`` (days ago)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_DAYS = re.compile(r"^(\d{1,6})d$")


def parse_before(text: str, now: datetime) -> datetime:
    """``text`` as an aware time: a date (midnight UTC), an ISO time (UTC when it names no
    zone), or ``<N>d``, N days before ``now``. ``ValueError`` names what is accepted."""
    text = text.strip()
    days = _DAYS.match(text)
    if days:
        try:
            return now - timedelta(days=int(days.group(1)))
        except OverflowError:
            raise ValueError(f"{text!r} is further back than any date") from None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a date: give 2026-01-31, an ISO time such as "
                         "2026-01-31T12:00:00+00:00, or 90d (ninety days ago)") from None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at
