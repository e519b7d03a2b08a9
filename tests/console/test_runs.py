"""Runs list and run page (console/runs.py): filters, keyset pages without OFFSET, live lease
partial, events in order, and cancel through ``runtime.loop.control.cancel``."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from console.runs import PAGE_SIZE
from runtime.loop.control import start
from runtime.models import Event, Run
from tests.console.conftest import sql_log

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def many_runs(sqlite_path, clock) -> list[int]:
    """PAGE_SIZE * 2 + 5 queued runs of the settings' `hello` agent, oldest first."""
    return [start("hello", {"name": "n", "language": "en"}, clock=clock).pk
            for _ in range(PAGE_SIZE * 2 + 5)]


def ids(response) -> list[int]:
    return [r.pk for r in response.context["runs"]]


def test_runs_are_newest_first_in_keyset_pages_without_offset(many_runs, operator):
    newest_first = many_runs[::-1]
    with sql_log() as queries:
        first = operator.get("/runs/")
    assert ids(first) == newest_first[:PAGE_SIZE]
    older = first.context["older"]
    assert older == newest_first[PAGE_SIZE - 1] and first.context["newer"] is None
    assert f"?before={older}" in first.content.decode()
    with sql_log() as more:
        second = operator.get(f"/runs/?before={older}")
    assert ids(second) == newest_first[PAGE_SIZE:2 * PAGE_SIZE]
    third = operator.get(f"/runs/?before={second.context['older']}")
    assert ids(third) == newest_first[2 * PAGE_SIZE:] and third.context["older"] is None
    # and back: ?after= gives the newer page again, in the same order
    back = operator.get(f"/runs/?after={third.context['newer']}")
    assert ids(back) == ids(second)
    sql = [s.upper() for s in [*queries, *more]]
    run_queries = [s for s in sql if 'FROM "RUNTIME_RUN"' in s]
    assert run_queries and all("OFFSET" not in s for s in sql), sql
    assert any('"RUNTIME_RUN"."ID" < ' in s and "LIMIT 51" in s for s in run_queries)


def test_runs_filter_by_status_and_agent_and_search_by_id(interrupted, many_runs, operator):
    w = interrupted("pay")
    assert ids(operator.get("/runs/?status=waiting")) == [w.run.pk]
    assert ids(operator.get("/runs/?agent=pay")) == [w.run.pk]
    assert ids(operator.get("/runs/?agent=pay&status=queued")) == []
    assert ids(operator.get(f"/runs/?q={many_runs[3]}")) == [many_runs[3]]
    assert ids(operator.get(f"/runs/?q=%23{many_runs[3]}")) == [many_runs[3]]
    bad = operator.get("/runs/?q=abc")
    assert ids(bad) == [] and "Search by run id" in bad.content.decode()
    unknown = operator.get("/runs/?status=bogus")  # never silently everything
    assert unknown.status_code == 400 and ids(unknown) == []
    assert "There is no status &#x27;bogus&#x27;: choose one of queued, running" in (
        unknown.content.decode())
    # the filter survives paging
    page = operator.get("/runs/?agent=hello").content.decode()
    assert "?agent=hello&amp;before=" in page


def test_runs_filter_over_htmx_renders_the_list_partial(many_runs, operator):
    html = operator.get("/runs/?status=queued", **HTMX).content.decode().strip()
    assert html.startswith('<div id="run-list"') and "<nav aria-label=\"Console\"" not in html


def test_run_page_shows_status_lease_totals_steps_and_events_in_order(interrupted, operator):
    w = interrupted()
    page = operator.get(f"/runs/{w.run.pk}/")
    html = page.content.decode()
    run = Run.objects.get(pk=w.run.pk)
    assert 'data-testid="run-status">waiting<' in html
    assert f"<dt>LLM requests</dt><dd>{run.llm_requests}</dd>" in html
    assert f"{run.tokens_in} in / {run.tokens_out} out" in html
    seqs = [e.seq for e in page.context["events"].rows]
    assert seqs == sorted(seqs) == list(range(1, Event.objects.filter(run=run).count() + 1))
    assert [s.index for s in page.context["steps"].rows] == [1]
    assert "step.interrupted" in html and "approval.requested" in html
    assert f"/admin/runtime/event/?run__id__exact={run.pk}" in html
    assert f'href="/approvals/{w.approval.pk}/"' in html


def test_run_page_live_partial_shows_the_lease_and_polls_until_the_end(
        sqlite_path, clock, operator):
    run = start("hello", {"name": "n"}, clock=clock)
    Run.objects.filter(pk=run.pk).update(  # a lease as a worker would hold it
        status="running", lease_owner="worker-x@host-1", lease_epoch=3,
        lease_expires_at=timezone.now() + timedelta(seconds=20))
    html = operator.get(f"/runs/{run.pk}/", **HTMX).content.decode().strip()
    assert html.startswith('<div id="run-live"') and 'hx-trigger="every 2s"' in html
    assert "worker-x@host-1" in html and "(live," in html
    Run.objects.filter(pk=run.pk).update(status="succeeded", lease_owner="",
                                         lease_expires_at=None)
    html = operator.get(f"/runs/{run.pk}/", **HTMX).content.decode()
    assert "hx-trigger" not in html  # finished: nothing more to poll


def test_failed_run_shows_its_failure(interrupted, operator):
    w = interrupted()
    operator.post(f"/approvals/{w.approval.pk}/", {
        "decision": "reject", "reject-note": "no", "reject-confirm": "on"})
    html = operator.get(f"/runs/{w.run.pk}/").content.decode()
    assert 'data-testid="failure-code">rejected<' in html
    assert 'data-testid="failure-message">run ended by olga: no<' in html  # the approval's words


def test_a_denied_policy_call_reads_denied_on_the_run_page(policy_paused, operator):
    """The run page words a policy check's refusal as its approval's page does ("denied by
    olga"), not as the stored message does ("olga rejected")."""
    w = policy_paused()
    operator.post(f"/approvals/{w.approval.pk}/", {
        "decision": "reject", "reject-note": "over the limit", "reject-confirm": "on"})
    html = operator.get(f"/runs/{w.run.pk}/").content.decode()
    assert 'data-testid="failure-message">denied by olga: over the limit<' in html


def test_cancel_needs_the_permission_and_confirmation(interrupted, operator, viewer):
    w = interrupted()
    assert "Cancel this run" not in viewer.get(f"/runs/{w.run.pk}/").content.decode()
    assert viewer.post(f"/runs/{w.run.pk}/", {"confirm": "on"}).status_code == 403
    assert operator.post(f"/runs/{w.run.pk}/", {"reason": "x"}).status_code == 422
    assert Run.objects.get(pk=w.run.pk).status == "waiting"
    assert 'id="cancel-run"' in operator.get(f"/runs/{w.run.pk}/").content.decode()
    # a poll keeps an open cancel form as the person left it (htmx's hx-preserve)
    assert re.search(r'<details id="cancel-run"[^>]* hx-preserve',
                     operator.get(f"/runs/{w.run.pk}/", **HTMX).content.decode())
    response = operator.post(f"/runs/{w.run.pk}/", {"reason": "duplicate", "confirm": "on"})
    assert response.status_code == 302
    run = Run.objects.get(pk=w.run.pk)
    assert run.status == "cancelled"
    cancelled = Event.objects.get(run=run, kind="run.cancelled")
    assert cancelled.actor == "olga" and cancelled.payload["reason"] == "duplicate"
    assert Event.objects.get(run=run, kind="approval.cancelled").actor == "olga"
    # a finished run cannot be cancelled: 409, nothing changes
    response = operator.post(f"/runs/{w.run.pk}/", {"confirm": "on"}, **HTMX)
    assert response.status_code == 409 and "Not cancelled" in response.content.decode()
    assert Event.objects.filter(run=run, kind="run.cancelled").count() == 1


def test_unknown_run_is_404(operator, sqlite_path):
    assert operator.get("/runs/12345/").status_code == 404
