"""The admin's pages read well: payloads as escaped compact JSON (whole on the event's page),
times to the millisecond with the zone, an actor filter that lists people and live workers (not
every worker that ever ran), the console's navigation with the pending count, and no template
syntax showing as text on any page."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.utils.html import escape

from runtime.admin.pages import EventActorFilter
from runtime.loop.control import start
from runtime.models import Approval, Event, Run, Step, Worker
from tests.console.conftest import client_for
from tests.console.test_admin import append_events, plan

MARKUP = "<script>alert('payload')</script>"
TEMPLATE_SYNTAX = ("{#", "#}", "{%", "%}")


@pytest.fixture
def superuser(make_user):
    return client_for(make_user("root", superuser=True))


def worker(owner: str, heartbeat_age: float, lease: float = 30) -> Worker:
    now = timezone.now()
    return Worker.objects.create(owner=owner, name="w", host="host-1", pid=4242,
                                 lease_seconds=lease, started_at=now - timedelta(hours=1),
                                 heartbeat_at=now - timedelta(seconds=heartbeat_age))


def test_payload_is_escaped_compact_json_in_the_list_and_whole_on_the_event_page(
        interrupted, superuser):
    run_id = interrupted().run.pk
    payload = {"note": MARKUP, "tail": "x" * 300, "n": 1}
    [event_id] = append_events(run_id, "worker-a", payload=payload)
    html = superuser.get(f"/admin/runtime/event/?q={run_id}").content.decode()
    compact = json.dumps(payload, sort_keys=True, ensure_ascii=False)
    assert '<code class="payload-short">' + escape(compact[:60]) in html  # one line, sorted
    assert MARKUP not in html and "&lt;script&gt;alert(" in html
    assert "x" * 300 not in html and "…</code>" in html  # cut in the list
    page = superuser.get(f"/admin/runtime/event/{event_id}/change/").content.decode()
    assert MARKUP not in page and "&lt;script&gt;alert(" in page
    pretty = json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False)
    assert escape(pretty) in page
    assert '<pre class="payload-pretty">' in page


def test_times_show_milliseconds_and_the_zone(interrupted, superuser):
    run_id = interrupted().run.pk
    at = datetime(2026, 12, 3, 20, 11, 8, 123456, tzinfo=UTC)
    [event_id] = append_events(run_id, "worker-a", kind="run.released", at=at)
    listing = superuser.get("/admin/runtime/event/?kind=run.released").content.decode()
    assert ">2026-12-03 20:11:08.123 UTC</time>" in listing
    page = superuser.get(f"/admin/runtime/event/{event_id}/change/").content.decode()
    assert ">2026-12-03 20:11:08.123 UTC</time>" in page
    run = Run.objects.get(pk=run_id)
    stamp = f"{run.created_at:%Y-%m-%d %H:%M:%S}.{run.created_at.microsecond // 1000:03d} UTC"
    assert stamp in superuser.get("/admin/runtime/run/").content.decode()
    assert stamp in superuser.get(f"/admin/runtime/run/{run_id}/change/").content.decode()
    step = Step.objects.filter(run_id=run_id).first()
    assert f"{step.started_at:%Y-%m-%d %H:%M:%S}." in \
        superuser.get("/admin/runtime/step/").content.decode()


def test_actor_filter_lists_people_and_live_workers_not_every_dead_worker(
        sqlite_path, clock, make_user, superuser):
    make_user("alice")
    make_user("bob")  # never acted: nothing to filter on
    run = start("hello", {"name": "n"}, created_by="alice", clock=clock)
    dead = [f"runworker@host-1:{1000 + i}:{i:08x}" for i in range(200)]
    for owner in dead:
        append_events(run.pk, owner)
    worker(dead[0], heartbeat_age=600)  # a crashed worker's row, long silent
    live = worker("runworker@host-1:7:live0001", heartbeat_age=2).owner
    append_events(run.pk, live, n=2)
    page = superuser.get("/admin/runtime/event/")
    [spec] = [s for s in page.context["cl"].filter_specs if isinstance(s, EventActorFilter)]
    assert dict(spec.lookup_choices) == {"alice": "alice", live: f"{live} (live worker)"}
    html = page.content.decode()
    assert not any(f"?actor={owner}" in html for owner in dead)
    with CaptureQueriesContext(connection) as ctx:
        spec.lookups(page.wsgi_request, None)
    reads = [q["sql"] for q in ctx.captured_queries if '"runtime_event"' in q["sql"]]
    assert reads
    for sql in reads:  # index probes by actor, never a scan (a DISTINCT would be one)
        steps = plan(sql).split(" / ")
        assert not [s for s in steps if s.startswith("SCAN") and ("event" in s or "U0" in s)]
        assert any("SEARCH" in s and "event_actor_at (actor=?)" in s for s in steps), steps
    chosen = superuser.get(f"/admin/runtime/event/?actor={dead[7]}")
    [event] = chosen.context["cl"].result_list
    assert event.actor == dead[7] and chosen.status_code == 200
    [spec] = [s for s in chosen.context["cl"].filter_specs if isinstance(s, EventActorFilter)]
    assert dead[7] in dict(spec.lookup_choices) and len(spec.lookup_choices) == 3
    [found] = superuser.get(f"/admin/runtime/event/?q={dead[9]}").context["cl"].result_list
    assert found.actor == dead[9]


def test_searching_an_actor_reads_the_actor_index(interrupted, superuser):
    interrupted()
    with CaptureQueriesContext(connection) as ctx:
        assert superuser.get("/admin/runtime/event/?q=worker-b").status_code == 200
    pages = [q["sql"] for q in ctx.captured_queries
             if q["sql"].startswith('SELECT "runtime_event"."id"') and "worker-b" in q["sql"]]
    assert pages
    for sql in pages:
        assert "INDEX event_actor_at" in plan(sql) and "TEMP B-TREE" not in plan(sql), sql


def test_admin_pages_wear_the_console_navigation_with_the_pending_count(interrupted, superuser):
    interrupted(), interrupted()
    pending = Approval.objects.filter(status="pending").count()
    assert pending == 2
    for url in ("/admin/", "/admin/runtime/event/", "/admin/runtime/run/"):
        html = superuser.get(url).content.decode()
        assert f'data-testid="pending-count">{pending}</span>' in html
        assert 'id="console-nav"' in html
        for link in ('href="/"', 'href="/runs/"', 'href="/workers/"', 'href="/admin/"'):
            assert link in html, (url, link)
        assert 'action="/logout/"' in html and "Log out" in html
        assert 'id="nav-sidebar"' not in html  # its width goes to the lists (admin.css)
        assert "console/admin.css" in html


def test_no_admin_page_shows_template_syntax(interrupted, policy_paused, superuser):
    w = interrupted()
    policy_paused()
    worker("runworker@host-1:7:live0001", heartbeat_age=2)
    event = Event.objects.filter(run=w.run).first()
    objects = {"event": event.pk, "run": w.run.pk, "step": w.approval.step_id,
               "approval": w.approval.pk, "worker": Worker.objects.get().pk}
    urls = ["/admin/", "/admin/runtime/", "/admin/runtime/event/?kind=step.started",
            f"/admin/runtime/event/?run__id__exact={w.run.pk}", "/admin/runtime/event/?q=worker-a",
            "/admin/runtime/event/?actor=worker-a&p=3", "/admin/runtime/run/?status=waiting"]
    for model, pk in objects.items():
        urls += [f"/admin/runtime/{model}/", f"/admin/runtime/{model}/{pk}/change/"]
    pages = [(url, superuser.get(url)) for url in urls]
    pages.append(("/admin/login/", Client().get("/admin/login/")))  # nobody logged in
    for url, page in pages:
        assert page.status_code == 200, url
        html = page.content.decode()
        shown = [s for s in TEMPLATE_SYNTAX if s in html]
        assert shown == [], (url, shown)
