"""Template filters for showing runtime records to people."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django import template
from django.utils import timezone

register = template.Library()


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON, keys sorted. Returned as a plain (unsafe) string, so autoescaping applies:
    arguments and results come from LLMs and tools and may contain markup."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@register.filter
def compact_json(value: Any, limit: int = 120) -> str:
    """One-line JSON for tables, cut at ``limit`` characters (escaped like any string)."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@register.filter
def age(since: datetime | None, now: datetime | None = None) -> str:
    """How long ago, to the second for short spans ("42s", "3m 12s", "2h 5m", "3d 4h")."""
    if since is None:
        return "—"
    delta = (now or timezone.now()) - since
    return duration(delta)


@register.filter
def until(moment: datetime | None, now: datetime | None = None) -> str:
    """How long from now until ``moment`` ("12s")."""
    if moment is None:
        return "—"
    return duration(moment - (now or timezone.now()))


@register.filter
def duration(delta: timedelta | None) -> str:
    if delta is None:
        return "—"
    seconds = int(delta.total_seconds())
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        text = f"{days}d {hours}h"
    elif hours:
        text = f"{hours}h {minutes}m"
    elif minutes:
        text = f"{minutes}m {secs}s"
    else:
        text = f"{secs}s"
    return sign + text
