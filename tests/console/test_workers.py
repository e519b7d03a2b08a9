"""Workers page (console/workers.py): live versus dead by heartbeat age against each worker's
own lease; live and recently dead workers on the first tab, older dead ones on ``?show=old``;
every query bounded however many dead rows pile up."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from playwright.sync_api import expect

from console.workers import SHOWN, recent_window
from runtime.loop.control import start
from runtime.models import Run, Worker
from tests.console.browser import shot

HOUR = 3600


def worker(owner: str, heartbeat_age: float, lease: float = 30, host: str = "host-1") -> Worker:
    now = timezone.now()
    return Worker.objects.create(owner=owner, name="w", host=host, pid=4242,
                                 lease_seconds=lease, started_at=now - timedelta(days=4),
                                 heartbeat_at=now - timedelta(seconds=heartbeat_age),
                                 concurrency=4)


def owners(page) -> list[str]:
    return [r["worker"].owner for r in page.context["rows"]]


def test_live_and_recently_dead_first_then_older_dead_on_their_own_tab(sqlite_path, clock, viewer):
    live = worker("w-live", 3)
    worker("w-dead-45s", 45)
    worker("w-dead-30m", 30 * 60)
    worker("w-dead-2h", 2 * HOUR)
    worker("w-dead-3d", 3 * 24 * HOUR)
    for _ in range(2):
        run = start("hello", {"name": "n"}, clock=clock)
        Run.objects.filter(pk=run.pk).update(status="running", lease_owner=live.owner,
                                             lease_expires_at=timezone.now())

    first = viewer.get("/workers/")
    assert first.status_code == 200
    assert owners(first) == ["w-live", "w-dead-45s", "w-dead-30m"]  # dead ones newest first
    rows = {r["worker"].owner: r for r in first.context["rows"]}
    assert rows["w-live"]["live"] and not rows["w-dead-45s"]["live"]
    assert rows["w-live"]["runs_held"] == 2 and rows["w-dead-45s"]["runs_held"] == 0
    html = first.content.decode()
    assert "1 live, 2 dead within the last 1h 0m." in html
    assert 'data-testid="heartbeat-age">3s<' in html and 'data-testid="heartbeat-age">45s<' in html
    assert re.search(r'data-testid="tab-old">Dead longer ago \(2\)</a>', html)
    assert "w-dead-2h" not in html

    older = viewer.get("/workers/", {"show": "old"})
    assert older.status_code == 200
    assert owners(older) == ["w-dead-2h", "w-dead-3d"]
    assert not any(r["live"] for r in older.context["rows"])
    html = older.content.decode()
    assert "2 dead workers whose last heartbeat is more than 1h 0m old." in html
    assert 'aria-current="page" data-testid="tab-old"' in html
    assert "w-live" not in html and "w-dead-45s" not in html


def test_live_is_judged_by_each_workers_own_lease(sqlite_path, viewer):
    """A heartbeat older than the recent window still means live under a longer lease; a
    heartbeat a second past a short lease means dead."""
    worker("w-long-lease", 2 * HOUR, lease=3 * HOUR)
    worker("w-short-lease", 2, lease=1)
    rows = {r["worker"].owner: r["live"] for r in viewer.get("/workers/").context["rows"]}
    assert rows == {"w-long-lease": True, "w-short-lease": False}
    assert owners(viewer.get("/workers/", {"show": "old"})) == []


def test_the_recent_window_is_a_setting(sqlite_path, viewer):
    worker("w-dead-45s", 45)
    worker("w-dead-30m", 30 * 60)
    with override_settings(CONSOLE_RECENT_DEAD_WORKERS_SECONDS=60):
        assert owners(viewer.get("/workers/")) == ["w-dead-45s"]
        older = viewer.get("/workers/", {"show": "old"})
        assert owners(older) == ["w-dead-30m"]
        assert "more than 1m 0s old" in older.content.decode()
    with override_settings(CONSOLE_RECENT_DEAD_WORKERS_SECONDS=10):
        assert owners(viewer.get("/workers/", {"show": "old"})) == ["w-dead-45s", "w-dead-30m"]
    assert owners(viewer.get("/workers/")) == ["w-dead-45s", "w-dead-30m"]  # one hour


def test_without_the_setting_the_window_is_an_hour(settings):
    del settings.CONSOLE_RECENT_DEAD_WORKERS_SECONDS
    assert recent_window() == timedelta(hours=1)


def _pile(prefix: str, n: int, age_from: float, lease: float = 30) -> None:
    now = timezone.now()
    Worker.objects.bulk_create(
        Worker(owner=f"{prefix}-{i}", host="host-1", pid=i, lease_seconds=lease,
               started_at=now - timedelta(days=30),
               heartbeat_at=now - timedelta(seconds=age_from + i)) for i in range(n))


def _worker_queries(viewer, **params: str) -> tuple[object, list[str]]:
    with CaptureQueriesContext(connection) as ctx:
        page = viewer.get("/workers/", params)
    assert page.status_code == 200
    return page, [q["sql"] for q in ctx.captured_queries if "runtime_worker" in q["sql"]]


def test_ten_thousand_dead_workers_are_never_loaded_whole(sqlite_path, viewer):
    worker("w-live", 1)
    _pile("recent", SHOWN + 50, age_from=60)  # dead within the hour, more than a page
    _pile("old", 10_000, age_from=2 * HOUR)

    first, first_sql = _worker_queries(viewer)
    older, older_sql = _worker_queries(viewer, show="old")
    assert len(first.context["rows"]) == SHOWN and owners(first)[:2] == ["w-live", "recent-0"]
    assert len(older.context["rows"]) == SHOWN
    assert owners(older)[:2] == ["old-0", "old-1"] and owners(older)[-1] == f"old-{SHOWN - 1}"
    assert (f"showing the {SHOWN} most recent of {SHOWN + 51}"
            in first.content.decode())  # the live one counts too
    assert f"showing the {SHOWN} most recent of 10000" in older.content.decode()
    assert "Dead longer ago (10000)" in first.content.decode()
    for sql in first_sql + older_sql:  # every read of the table is capped or a count
        assert re.search(r"\bLIMIT\b", sql) or "COUNT(" in sql.upper(), sql

    # Twice the dead rows, the same statements: the cost does not grow with the pile.
    _pile("older", 10_000, age_from=3 * HOUR)
    _pile("recent-again", SHOWN, age_from=120)
    _first, first_again = _worker_queries(viewer)
    _older, older_again = _worker_queries(viewer, show="old")
    assert len(first_again) == len(first_sql) and len(older_again) == len(older_sql)


@pytest.mark.parametrize("show", ["all", "OLD", "dead"])
def test_an_unknown_tab_is_a_400_that_names_the_choices(sqlite_path, viewer, show):
    worker("w-live", 1)
    page = viewer.get("/workers/", {"show": show})
    assert page.status_code == 400
    html = page.content.decode()
    assert f"There is no list &#x27;{show}&#x27; of workers" in html
    assert "leave show out" in html and "show=old" in html
    assert page.context["rows"] == []
    poll = viewer.get("/workers/", {"show": show}, HTTP_HX_REQUEST="true")
    assert poll.status_code == 400 and poll.content.decode().lstrip().startswith(
        '<div id="worker-list"')


def test_the_poll_renders_the_list_partial_and_keeps_its_tab(sqlite_path, viewer):
    html = viewer.get("/workers/", HTTP_HX_REQUEST="true").content.decode().strip()
    assert html.startswith('<div id="worker-list" hx-get="/workers/"')
    assert "No worker is live or died in the last 1h 0m" in html
    older = viewer.get("/workers/", {"show": "old"}, HTTP_HX_REQUEST="true")
    html = older.content.decode().strip()
    assert html.startswith('<div id="worker-list" hx-get="/workers/?show=old"')
    assert set(older["Cache-Control"].replace(" ", "").split(",")) == {"private", "no-store"}


@pytest.mark.slow
def test_a_phone_never_scrolls_sideways(make_user, log_in):
    """390 px wide, long owner and host names, both tabs: the page is no wider than the
    screen."""
    from tests.console.conftest import PASSWORD

    make_user("pia", "runtime.view_run", password=PASSWORD)
    long_host = "build-runner-with-a-very-long-name.eu-central-1.compute.internal"
    for i, age in enumerate((2, 600, 3 * HOUR)):
        worker(f"refund-desk-worker@{long_host}:{40000 + i}:0123abcd", age, host=long_host)
    page = log_in("pia")
    page.set_viewport_size({"width": 390, "height": 844})
    for url, rows in (("/workers/", 2), ("/workers/?show=old", 1)):
        page.goto(url)
        expect(page.get_by_test_id("worker-row")).to_have_count(rows)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"{url} is {width}px wide at 390"
        shot(page, "workers-phone.png" if rows == 2 else "workers-old-phone.png")
