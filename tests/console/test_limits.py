"""Input limits in the console: a resolve result nested past RUNTIME["MAX_PAYLOAD_DEPTH"]
(however deep: 40, 1,000 or 100,000 levels), larger than MAX_PAYLOAD_BYTES, or not storable
is a 422 form error that changes nothing, never a 500 or a stored value that breaks a page;
and values at the limits are stored and shown on every page."""

from __future__ import annotations

import json

import pytest

from runtime import resume
from runtime.agents.agent import registry
from runtime.approvals import decisions as approvals
from runtime.crashpoints import CrashPoint
from runtime.errors import InvalidDecision
from runtime.loop.control import start
from runtime.models import Approval, Event, Run, Step
from tests.console.conftest import client_for, crash_then_take_over, pay_agent
from tests.console.test_approvals import decide, snapshot
from tests.kit import Ledger
from tests.runtime.test_limits import LIMIT, TOO_DEEP, nest, nested_text

REFUSED = f"The result cannot be stored: {TOO_DEEP}."


def assert_refused(response, approval: Approval, before: tuple, message: str) -> None:
    assert response.status_code == 422
    html = response.content.decode()
    assert message in html, html[-2000:]
    assert '<details id="decide-resolve" class="decision decision-resolve"' in html
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert snapshot(approval.run_id) == before


@pytest.mark.parametrize("depth", [LIMIT + 1, 40, 1_000, 100_000])
@pytest.mark.parametrize("htmx", [False, True])
def test_resolve_nested_past_the_limit_is_a_422_and_changes_nothing(interrupted, operator,
                                                                   depth, htmx):
    w = interrupted()
    before = snapshot(w.run.pk)
    response = decide(operator, w.approval, "resolve", htmx=htmx, result=nested_text(depth))
    assert_refused(response, w.approval, before, REFUSED)


def test_resolve_of_plain_brackets_100000_deep_is_a_422(interrupted, operator):
    w = interrupted()
    before = snapshot(w.run.pk)
    text = "[" * 100_000 + "]" * 100_000
    assert_refused(decide(operator, w.approval, "resolve", result=text), w.approval, before,
                   REFUSED)
    unclosed = "{" + '"a":[' * 50_000  # not even JSON: still a form error, not a crash
    response = decide(operator, w.approval, "resolve", result=unclosed)
    assert response.status_code == 422 and Approval.objects.get(pk=w.approval.pk).status == \
        "pending"


def test_resolve_text_larger_than_the_limit_is_refused_before_it_is_parsed(
        interrupted, operator, settings, monkeypatch):
    settings.RUNTIME = {**settings.RUNTIME, "MAX_PAYLOAD_BYTES": 1000}
    w = interrupted()
    before = snapshot(w.run.pk)
    big = json.dumps({"note": "x" * 1200})
    parsed: list[str] = []
    real = json.loads
    monkeypatch.setattr(json, "loads", lambda s, *a, **kw: parsed.append(s) or real(s, *a, **kw))
    response = decide(operator, w.approval, "resolve", result=big)
    size = len(big.encode())
    assert_refused(response, w.approval, before, f"The result cannot be stored: {size} bytes "
                   "is larger than the limit of 1000 bytes.")
    assert big not in parsed  # refused on its size alone
    small = json.dumps({"note": "x" * 100})
    assert decide(operator, w.approval, "resolve", result=small).status_code == 302


def test_resolve_with_a_lone_surrogate_is_a_422(interrupted, operator):
    w = interrupted()
    before = snapshot(w.run.pk)
    response = decide(operator, w.approval, "resolve", result='{"note": "\\udc80"}')
    assert_refused(response, w.approval, before, "lone surrogate")


@pytest.mark.parametrize("depth", [LIMIT + 1, 100_000])
def test_the_runtime_refuses_a_deep_resolve_from_any_caller(interrupted, depth):
    w = interrupted()
    before = snapshot(w.run.pk)
    with pytest.raises(InvalidDecision, match=f"resolved result: {TOO_DEEP}"):
        approvals.resolve(w.approval.pk, "olga", nest(depth))
    assert snapshot(w.run.pk) == before


def test_values_at_the_limit_are_stored_and_every_page_shows_them(sqlite_path, tmp_path, clock,
                                                                 operator, make_user):
    """A run whose input and resolved result are nested exactly to the limit: the approval,
    the run, and the admin's lists and pages all render, before and after the run ends."""
    agent = pay_agent("deep", Ledger(tmp_path / "ledger"))
    value = nest(LIMIT)
    with registry.override(agent):
        run = start("deep", value, clock=clock)
        run = crash_then_take_over(run.pk, clock, CrashPoint.AFTER_TOOL_EFFECT, 1)
        approval = Approval.objects.get(run_id=run.pk, status="pending")
        text = nested_text(LIMIT)
        assert decide(operator, approval, "resolve", result=text).status_code == 302
        assert Approval.objects.get(pk=approval.pk).result == json.loads(text)
        assert Step.objects.get(run_id=run.pk, index=1).result == json.loads(text)
        assert Run.objects.get(pk=run.pk).input == value
        admin = client_for(make_user("root", superuser=True))

        def pages() -> None:
            resolved = Event.objects.get(run_id=run.pk, kind="approval.resolved")
            created = Event.objects.get(run_id=run.pk, kind="run.created")
            for client, url in [
                (operator, f"/approvals/{approval.pk}/"), (operator, f"/runs/{run.pk}/"),
                (operator, "/runs/"), (operator, "/"),
                (admin, "/admin/runtime/event/"),
                (admin, f"/admin/runtime/event/?run__id__exact={run.pk}"),
                (admin, f"/admin/runtime/event/{resolved.pk}/change/"),
                (admin, f"/admin/runtime/event/{created.pk}/change/"),
                (admin, f"/admin/runtime/approval/{approval.pk}/change/"),
                (admin, f"/admin/runtime/run/{run.pk}/change/"),
                (admin, f"/admin/runtime/step/{approval.step_id}/change/"),
            ]:
                assert client.get(url).status_code == 200, url

        pages()
        assert resume(run.pk, clock=clock).status == "succeeded"
        pages()
