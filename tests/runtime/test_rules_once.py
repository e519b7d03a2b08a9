"""Rules written once, held to it: when a lease holds (every rendering of storage.leases agrees,
on both engines), what an effect is called (runtime.effects), how a recorded time is written
(canonical.iso_time), and which kinds of event exist (storage.events.EventKind)."""

from __future__ import annotations

import ast
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import get_args

import pytest
from django.db import connection

from runtime import tool
from runtime.admin.pages import EventKindFilter
from runtime.audit.replay import HANDLERS
from runtime.canonical import iso_time, iso_time_or_none
from runtime.clock import ManualClock
from runtime.effects import Effect, EffectName
from runtime.loop.control import start
from runtime.models import Approval, Run, Step
from runtime.storage.engines import lease_expired
from runtime.storage.events import EVENT_KINDS, EventKind, EventSpec
from runtime.storage.leases import lease_gone_sql, lease_live_sql

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.engines
def test_every_rendering_of_the_lease_rule_agrees(database):
    clock = ManualClock()
    now = clock.now()
    expiries = {"none": None, "long past": now - timedelta(hours=1), "just past":
                now - timedelta(microseconds=1), "now": now, "just ahead":
                now + timedelta(microseconds=1), "ahead": now + timedelta(hours=1)}
    ids = {}
    for name, expires in expiries.items():
        run = start("hello", {"name": name}, clock=clock)
        Run.objects.filter(pk=run.pk).update(lease_expires_at=expires)
        ids[run.pk] = name
    param = connection.ops.adapt_datetimefield_value(now)

    def where(condition: str) -> set[str]:
        with connection.cursor() as cursor:
            cursor.execute(f'SELECT "id" FROM "runtime_run" WHERE {condition}', [param])
            return {ids[row[0]] for row in cursor.fetchall()}

    live, gone = where(lease_live_sql("%s")), where(lease_gone_sql("%s"))
    assert live == {"just ahead", "ahead"}
    assert gone == set(expiries) - live  # every row one or the other, NULL included
    # For rows that carry a lease, the index-friendly form says the same.
    assert where(lease_gone_sql("%s", held=True)) == gone - {"none"}
    by_orm = {ids[pk] for pk, expired in Run.objects.annotate(
        expired=lease_expired(clock)).values_list("pk", "expired") if expired}
    assert by_orm == gone


def test_an_effect_has_one_spelling_everywhere():
    assert set(get_args(EffectName)) == set(Effect.values)
    for model in (Step, Approval):
        assert model._meta.get_field("effect").choices == Effect.choices
    with pytest.raises(ValueError, match="'read_only', 'side_effect'"):
        tool(lambda: None, effect="maybe")  # type: ignore[arg-type]


def test_a_recorded_time_is_utc_to_the_microsecond_whatever_zone_it_came_in():
    at = datetime(2026, 3, 29, 3, 30, tzinfo=timezone(timedelta(hours=2)))
    assert iso_time(at) == "2026-03-29T01:30:00.000000+00:00"
    assert iso_time(at.astimezone(UTC)) == iso_time(at)
    assert iso_time_or_none(None) is None


def test_no_module_but_canonical_writes_a_recorded_time():
    """A time inside a hashed payload is written by ``canonical.iso_time`` alone: a second
    spelling (no UTC normalisation, no microseconds) would hash differently."""
    offenders = []
    for path in (ROOT / "runtime").rglob("*.py"):
        if path.name == "canonical.py" or "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "isoformat"
                    and any(k.arg == "timespec" and isinstance(k.value, ast.Constant)
                            and k.value.value == "microseconds" for k in node.keywords)):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_the_event_kinds_are_one_catalogue():
    assert set(EventKind) == EVENT_KINDS
    assert set(HANDLERS) == set(EventKind)  # replay knows the meaning of every kind
    listed = EventKindFilter.lookups(None, None, None)  # type: ignore[arg-type]
    assert [kind for kind, _label in listed] == sorted(EventKind)
    with pytest.raises(ValueError, match="unknown event kind"):
        EventSpec("step.teleported", {})
