"""Template filters for showing runtime records to people."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django import template
from django.utils import timezone
from django.utils.html import format_html

from console import wording

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


@register.filter
def seconds(value: int | None) -> str:
    """A number of seconds as a duration ("1h 0m")."""
    return "—" if value is None else duration(timedelta(seconds=value))


def stamp(at: datetime) -> str:
    """Every time the console shows, in one form: UTC, to the second ("2026-12-03 20:11:08
    UTC"); the words' own (``console.wording.utc``)."""
    return wording.utc(at.astimezone(UTC))


def _iso(at: datetime) -> str:
    """For ``datetime`` attributes: exact (the countdowns count from it), read by machines."""
    return at.astimezone(UTC).isoformat()


@register.filter
def utc(at: datetime | str | None) -> str:
    """A moment as "2026-12-03 20:11:08 UTC" in a ``<time>`` element: the one way the
    console writes a time (no milliseconds, the zone said once). An ISO text (the demo's
    outside world keeps its times so) is read first; one that is not a time is shown as is."""
    if isinstance(at, str):
        try:
            parsed = datetime.fromisoformat(at)
        except ValueError:
            return at
        at = parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    if at is None:
        return "—"
    return format_html('<time datetime="{}">{}</time>', _iso(at), stamp(at))


@register.filter
def utc_clock(at: datetime | None) -> str:
    """Just the time of day ("20:11:08"), for tables whose heading says UTC; the whole
    moment in its tooltip."""
    if at is None:
        return "—"
    return format_html('<time datetime="{}" title="{}">{}</time>', _iso(at), stamp(at),
                       f"{at.astimezone(UTC):%H:%M:%S}")


@register.filter
def cost(value: Decimal | float | int | str | None) -> str:
    """A run's LLM cost in US dollars, as everywhere in the console: "$0.0123" (at least two
    decimals, at most the six stored)."""
    if value is None or value == "":
        return "—"
    amount = Decimal(str(value)).quantize(Decimal("0.000001"))
    text = f"{amount:f}".rstrip("0")
    whole, _, cents = text.partition(".")
    return f"${whole}.{cents.ljust(2, '0')}"


@register.simple_tag
def moment(at: datetime | None, now: datetime | None = None) -> str:
    """A moment as "2026-12-03 20:11:08 UTC (3m 12s ago)"; the age keeps counting in the
    browser (console.js), so a page that is not re-rendered never shows a frozen age."""
    if at is None:
        return "—"
    return format_html('{} (<time datetime="{}" data-age>{}</time> ago)', utc(at), _iso(at),
                       age(at, now))


@register.simple_tag
def since(at: datetime | None, now: datetime | None = None) -> str:
    """Just the age ("3m 12s"), counting on in the browser; the full time in its tooltip."""
    if at is None:
        return "—"
    return format_html('<time datetime="{}" data-age title="{}">{}</time>', _iso(at),
                       stamp(at), age(at, now))


@register.simple_tag
def left(until_at: datetime | None, now: datetime | None = None) -> str:
    """Time left until a moment ("12s"), counting down in the browser."""
    if until_at is None:
        return "—"
    return format_html('<time datetime="{}" data-until>{}</time>', until_at.isoformat(),
                       until(until_at, now))


# A deadline closer than this is shown as soon (the queue marks it).
DEADLINE_SOON = timedelta(minutes=5)


@register.simple_tag
def deadline(at: datetime | None, now: datetime | None = None) -> str:
    """Time left until an approval's deadline: "expires in 12m 5s", counting down in the
    browser, the moment itself in the tooltip; once passed, "deadline passed" and when."""
    if at is None:
        return ""
    now = now or timezone.now()
    if at <= now:
        return format_html('<span class="deadline deadline-passed" data-testid="deadline-left">'
                           'deadline passed {}</span>', utc(at))
    soon = " deadline-soon" if at - now <= DEADLINE_SOON else ""
    return format_html('<span class="deadline{}" data-testid="deadline-left">expires in '
                       '<time datetime="{}" data-until title="{}">{}</time></span>',
                       soon, _iso(at), stamp(at), until(at, now))


@register.filter
def in_zone(at: datetime | None, zone: str) -> str:
    """A moment in a named time zone ("2026-12-05 08:00 Europe/Berlin"), for schedules whose
    cron is read there; UTC if the name is not a zone."""
    if at is None:
        return "—"
    try:
        local = at.astimezone(ZoneInfo(zone))
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        local, zone = at.astimezone(UTC), "UTC"
    return f"{local:%Y-%m-%d %H:%M} {zone}"


@register.filter
def kind_word(kind: str) -> str:
    """An approval kind in the console's words ("interrupted call", "policy check")."""
    return wording.kind_word(kind)


@register.simple_tag
def approval_status(approval: Any) -> str:
    """An approval's status in the words of its kind ("allowed, started at …")."""
    return wording.status_word(approval)


@register.simple_tag
def run_failure(run: Any, approvals: Any) -> str:
    """Why a run failed, in the words of the approval that ended it if one did ("denied by
    ada: too large" for a policy check, as its approval's page says), else the runtime's."""
    return wording.failure_words(run, approvals)
