"""The console says when a run waits for a worker and no live worker has its agent: "no live
worker runs agent X" on the run's page and beside its status in the runs list. The rule is the
selectors' (a live worker by ``worker_live``, a waiting run where a claim looks), and the page
agrees with the claims themselves: a flagged run is one that no live worker's claim would
return. In the browser, the note comes and goes with the workers while the page is open."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect

from runtime import selectors
from runtime.leasing.claims import runnable
from runtime.loop.control import start
from runtime.models import Run, Worker
from tests.console.browser import PHONE, shot

NOTE = "no live worker runs agent"


@pytest.fixture
def viewer(database) -> Client:
    user = User.objects.create_user("victor")
    user.user_permissions.add(Permission.objects.get(content_type__app_label="runtime",
                                                     codename="view_run"))
    client = Client()
    client.force_login(User.objects.get(pk=user.pk))
    return client


def _worker(owner: str, agents: list[str], *, age: float = 0.0) -> Worker:
    now = timezone.now()
    return Worker.objects.create(owner=owner, host="h", pid=1, lease_seconds=30, agents=agents,
                                 started_at=now, heartbeat_at=now - timedelta(seconds=age))


def _running(run: Run, *, lease_left: float) -> None:
    Run.objects.filter(pk=run.pk).update(
        status="running", lease_owner="gone@h:1:x", lease_epoch=1,
        lease_expires_at=timezone.now() + timedelta(seconds=lease_left))


def _run_page(client: Client, run: Run) -> str:
    response = client.get(f"/runs/{run.pk}/")
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.engines
def test_the_run_page_says_no_live_worker_runs_the_agent_until_one_does(viewer):
    run = start("hello", {"name": "n"})
    _worker("old@h:1:a", ["other"])
    _worker("dead@h:2:b", ["hello"], age=60)  # has it, but its heartbeat is older than its lease
    page = _run_page(viewer, run)
    assert "No live worker runs agent <code>hello</code>" in page
    assert 'data-testid="no-worker"' in page
    seen = viewer.get(f"/runs/{run.pk}/").context["version"]

    _worker("new@h:3:c", ["hello", "other"])
    # An open page's poll with the version it shows gets the new content: the run itself did
    # not change, but a worker that can run it appeared.
    poll = viewer.get(f"/runs/{run.pk}/", {"seen": seen}, headers={"HX-Request": "true"})
    assert poll.status_code == 200
    assert "No live worker" not in poll.content.decode()
    shown = re.search(r'data-version="([^"]+)"', poll.content.decode())[1]
    again = viewer.get(f"/runs/{run.pk}/", {"seen": shown}, headers={"HX-Request": "true"})
    assert again.status_code == 204  # nothing changed since


@pytest.mark.engines
def test_only_runs_that_wait_for_a_worker_get_the_note(viewer):
    """Queued, or running with the lease gone; a live lease, a wait for a person or an end
    needs no worker now."""
    queued = start("hello", {"name": "q"})
    lapsed, leased, done = (start("hello", {"name": n}) for n in ("l", "r", "d"))
    _running(lapsed, lease_left=-1)
    _running(leased, lease_left=600)
    Run.objects.filter(pk=done.pk).update(status="succeeded")
    for run in (queued, lapsed):
        assert NOTE.capitalize() in _run_page(viewer, run)
    for run in (leased, done):
        assert "No live worker" not in _run_page(viewer, run)

    listed = viewer.get("/runs/")
    body = listed.content.decode()
    assert listed.context["no_worker"] == {queued.pk: "hello", lapsed.pk: "hello"}
    assert body.count(f"{NOTE} hello") == 2
    _worker("w@h:1:a", ["hello"])
    assert NOTE not in viewer.get("/runs/").content.decode()


@pytest.mark.engines
def test_the_page_flags_exactly_the_runs_no_live_workers_claim_would_take(viewer):
    """Agreement with the runtime: for each waiting run, flagged on the page if and only if
    none of the live workers' claims (their own agents, the claim's own query) finds it."""
    runs = {name: start("hello", {"name": name}) for name in ("a", "b", "c")}
    Run.objects.filter(pk=runs["b"].pk).update(agent="refunds")
    Run.objects.filter(pk=runs["c"].pk).update(agent="greeter")
    _running(runs["c"], lease_left=-1)
    _worker("w1@h:1:a", ["hello"])
    _worker("w2@h:2:b", ["greeter", "billing"])
    _worker("dead@h:3:c", ["refunds"], age=60)
    now = timezone.now()
    live = Worker.objects.filter(owner__in=selectors.live_workers(now))
    claimable = {run.pk for w in live for qs in runnable(agents=w.agents, limit=100)
                 for run in qs}
    flagged = viewer.get("/runs/").context["no_worker"]
    assert set(flagged) == {r.pk for r in runs.values()} - claimable == {runs["b"].pk}
    assert flagged[runs["b"].pk] == "refunds"


def _no_stray_template_text(page) -> None:
    text = page.locator("body").inner_text()
    assert not any(mark in text for mark in ("{{", " }}", "{%", "%}")), text  # JSON ends "}}"


@pytest.mark.slow
def test_the_note_in_the_browser_comes_and_goes_with_the_workers(sqlite_path, people, log_in):
    run = start("hello", {"name": "n"})
    _worker("old@h:1:a", ["other"])
    people("olga")
    page = log_in("olga")
    page.goto(f"/runs/{run.pk}/")
    note = page.get_by_test_id("no-worker")
    expect(note).to_have_text("No live worker runs agent hello: this run waits until a worker "
                              "that has the agent starts (a deploy not finished, or every "
                              "worker started with --agents leaving it out).")
    _no_stray_template_text(page)
    shot(page, "run-no-worker.png")
    page.goto("/runs/")
    expect(page.get_by_test_id("no-worker")).to_have_text("no live worker runs agent hello")
    _no_stray_template_text(page)
    shot(page, "runs-no-worker.png")
    phone = log_in("olga", viewport=PHONE)
    phone.goto("/runs/")
    expect(phone.get_by_test_id("no-worker")).to_be_visible()
    assert phone.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    shot(phone, "runs-no-worker-phone.png")

    page.goto(f"/runs/{run.pk}/")
    expect(note).to_be_visible()
    _worker("new@h:2:b", ["hello"])
    expect(note).to_have_count(0)  # the open page's next poll
    expect(page.get_by_test_id("run-status")).to_have_text("queued")
