"""Pages that never go stale and stay cheap: an open approval or run polls with the version it
shows and is re-rendered whole when anything about it changed (a decision by someone else,
the run moving on), gets a 204 otherwise, and a run of thousands of steps costs its page no
more than a short one."""

from __future__ import annotations

import re
from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runtime import resume
from runtime.loop.control import start
from runtime.models import Approval, Event, Run, Step
from tests.console.conftest import client_for
from tests.console.test_approvals import HTMX, decide


def version_of(html: str) -> str:
    return re.search(r'data-version="([^"]+)"', html).group(1)


def test_an_open_approval_follows_a_decision_made_elsewhere(interrupted, operator, make_user):
    w = interrupted()
    url = f"/approvals/{w.approval.pk}/"
    shown = operator.get(url).content.decode()
    version = version_of(shown)
    assert re.search(rf'hx-get="{url}\?seen={re.escape(version)}" hx-trigger="every 3s"', shown)
    assert operator.get(f"{url}?seen={version}", **HTMX).status_code == 204  # nothing new

    other = client_for(make_user("pat", "runtime.view_run", "runtime.decide_approval"))
    decide(other, w.approval, "reject", note="duplicate order")
    poll = operator.get(f"{url}?seen={version}", **HTMX)
    html = poll.content.decode()
    assert poll.status_code == 200 and html.lstrip().startswith('<div id="approval-live"')
    # header, banner, steps and decision all show the new state
    assert 'data-testid="run-status">failed<' in html
    assert 'data-testid="approval-status">run ended<' in html
    assert "Outcome unknown" not in html and 'id="decide-' not in html
    assert "decided by pat" in html and "The run ended failed" in html
    step_row = re.search(r'<tr class="current" data-testid="timeline-step">(.*?)</tr>', html,
                         re.S).group(1)
    assert "status-rejected" in step_row
    assert "hx-trigger" not in html  # decided and the run ended: nothing left to watch


def test_a_decided_approval_keeps_following_its_run_until_it_ends(interrupted, operator, clock):
    w = interrupted()
    decide(operator, w.approval, "approve")
    url = f"/approvals/{w.approval.pk}/"
    html = operator.get(url).content.decode()
    assert 'data-testid="run-status">queued<' in html and "hx-trigger" in html
    resume(w.run.pk, clock=clock)
    html = operator.get(f"{url}?seen={version_of(html)}", **HTMX).content.decode()
    assert 'data-testid="run-status">succeeded<' in html and "hx-trigger" not in html


def test_a_cancelled_run_takes_the_banner_and_the_decisions_away(interrupted, operator):
    w = interrupted()
    operator.post(f"/runs/{w.run.pk}/", {"reason": "customer left", "confirm": "on"})
    html = operator.get(f"/approvals/{w.approval.pk}/").content.decode()
    assert Approval.objects.get(pk=w.approval.pk).status == "cancelled"
    assert "Outcome unknown" not in html and 'id="decide-' not in html
    assert "Nothing will run: this approval was cancelled." in html


def long_run(steps: int, events_per_step: int = 2) -> Run:
    """A finished run of ``steps`` steps and their events, written in bulk (what a long run
    leaves behind; how it got there is not what these tests look at)."""
    run = start("hello", {"name": "long"})
    now = timezone.now()
    Step.objects.bulk_create(
        Step(run=run, index=i, status="succeeded", tool="look", arguments={"i": i},
             effect="read_only", idempotency_key=f"k-{run.pk}-{i}", result={"ok": i},
             attempt=1, started_at=now, finished_at=now) for i in range(1, steps + 1))
    first = run.event_seq + 1
    total = steps * events_per_step
    Event.objects.bulk_create(
        Event(run=run, step_index=1 + (seq - first) // events_per_step, seq=seq, kind="step.begun",
              payload={"n": seq}, actor="worker-1", at=now + timedelta(microseconds=seq),
              hash=f"{seq:064x}") for seq in range(first, first + total))
    Run.objects.filter(pk=run.pk).update(status="succeeded", event_seq=first + total - 1)
    return Run.objects.get(pk=run.pk)


def queries(client, url: str, **extra) -> tuple[int, str]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, **extra)
    assert response.status_code == 200, url
    return len(ctx.captured_queries), response.content.decode()


def test_a_long_run_shows_its_latest_steps_and_events_with_a_way_to_the_rest(sqlite_path, operator):
    run = long_run(600)
    n_long, html = queries(operator, f"/runs/{run.pk}/")
    shown = [int(i) for i in re.findall(
        r'<tr data-testid="step-row">\s*<td[^>]*class="num">(\d+)</td>', html)]
    assert shown == list(range(551, 601))
    assert "600 in all" in html
    assert 'href="?steps_before=551"' in html
    assert f"The latest 50 of {run.event_seq} events" in html
    assert f"/admin/runtime/event/?run__id__exact={run.pk}" in html

    _, earlier = queries(operator, f"/runs/{run.pk}/?steps_before=551")
    assert [int(i) for i in re.findall(
        r'<tr data-testid="step-row">\s*<td[^>]*class="num">(\d+)</td>', earlier)] == list(
        range(501, 551))
    assert 'href="?steps_before=501"' in earlier and "Latest steps" in earlier
    _, first = queries(operator, f"/runs/{run.pk}/?steps_before=51")
    assert "Earlier steps" not in first and first.count('data-testid="step-row"') == 50

    short = long_run(3)
    n_short, _ = queries(operator, f"/runs/{short.pk}/")
    assert n_long == n_short  # the page's cost does not grow with the run


def test_an_approval_late_in_a_long_run_shows_the_steps_just_before_it(interrupted, operator):
    w = interrupted()
    html = operator.get(f"/approvals/{w.approval.pk}/").content.decode()
    assert html.count('data-testid="timeline-step"') == 1
    assert "the run's page</a> has all" not in html
    # the same approval with 300 steps before it: the last 20, and a way to the rest
    Step.objects.filter(run_id=w.run.pk).update(index=301)
    now = timezone.now()
    Step.objects.bulk_create(
        Step(run_id=w.run.pk, index=i, status="succeeded", tool="look", effect="read_only",
             idempotency_key=f"k{i}", started_at=now) for i in range(1, 301))
    html = operator.get(f"/approvals/{w.approval.pk}/").content.decode()
    indexes = [int(i) for i in re.findall(
        r'data-testid="timeline-step">\s*<td[^>]*class="num">(\d+)</td>', html)]
    assert indexes == list(range(282, 302))
    assert "the run's page</a> has all 301" in html


def test_a_run_poll_answers_204_until_the_run_or_its_lease_changes(sqlite_path, operator, clock):
    run = start("hello", {"name": "n"}, clock=clock)
    Run.objects.filter(pk=run.pk).update(
        status="running", lease_owner="worker-x@host-1", lease_epoch=3,
        lease_expires_at=timezone.now() + timedelta(seconds=30))
    html = operator.get(f"/runs/{run.pk}/").content.decode()
    version = version_of(html)
    assert operator.get(f"/runs/{run.pk}/?seen={version}", **HTMX).status_code == 204
    # the worker died: no event, but the lease lapsed, and the page must say so
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    moved = operator.get(f"/runs/{run.pk}/?seen={version}", **HTMX)
    assert moved.status_code == 200 and "(expired)" in moved.content.decode()


def test_the_queue_loads_only_what_it_shows_in_a_fixed_number_of_queries(
        interrupted, policy_paused, operator):
    interrupted()
    n_one, _ = queries(operator, "/")
    for _ in range(3):
        interrupted("refund")
    policy_paused()
    with CaptureQueriesContext(connection) as ctx:
        response = operator.get("/")
    assert response.status_code == 200 and len(response.context["items"]) == 5
    assert len(ctx.captured_queries) == n_one  # no query per row
    listing = next(q["sql"] for q in ctx.captured_queries
                   if "runtime_approval" in q["sql"] and "LIMIT" in q["sql"])
    for column in ('"runtime_run"."input"', '"runtime_step"."arguments"',
                   '"runtime_approval"."arguments"', '"runtime_step"."result"'):
        assert column not in listing, column
