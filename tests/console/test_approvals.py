"""The approval queue and approval page (console/approvals.py), through Django's test client:
what is shown, who may decide, and that every refused decision changes nothing."""

from __future__ import annotations

import json
import re
from html import unescape

import pytest

from runtime.agents.agent import registry
from runtime.models import Approval, Event, Run, Step
from runtime.testkit import Crash, CrashPoint, InProcessKit, Ledger
from runtime.testkit import agents as kit_agents
from tests.console.conftest import XSS, Waiting, client_for, sql_log

HTMX = {"HTTP_HX_REQUEST": "true"}


def snapshot(run_id: int) -> tuple:
    """Everything a refused decision must leave as it was."""
    return (
        Run.objects.values().get(pk=run_id),
        list(Approval.objects.filter(run_id=run_id).order_by("pk").values()),
        list(Step.objects.filter(run_id=run_id).order_by("index").values()),
        list(Event.objects.filter(run_id=run_id).order_by("seq").values_list("seq", "hash")),
    )


def decide(client, approval: Approval, decision: str, htmx: bool = False, **fields: str):
    data = {"decision": decision, f"{decision}-confirm": "on"}
    data.update({f"{decision}-{k}": v for k, v in fields.items()})
    return client.post(f"/approvals/{approval.pk}/", data, **(HTMX if htmx else {}))


# -- the queue -----------------------------------------------------------------------------------


def test_queue_lists_pending_oldest_first_with_run_agent_step_tool_effect_and_wait(
        interrupted, policy_paused, operator, clock):
    first = interrupted("pay")
    clock.advance(60)
    second = policy_paused()
    clock.advance(60)
    third = interrupted("refund")
    page = operator.get("/")
    assert page.status_code == 200
    rows = page.context["items"]
    assert [a.pk for a in rows] == [first.approval.pk, second.approval.pk, third.approval.pk]
    html = page.content.decode()
    assert html.index(f'data-id="{first.approval.pk}"') < html.index(
        f'data-id="{second.approval.pk}"') < html.index(f'data-id="{third.approval.pk}"')
    for text in (f"#{first.run.pk}", "pay", "<code>send</code>", "side_effect", "charger",
                 "<code>charge</code>"):
        assert text in html
    assert 'data-testid="pending-count">3<' in html  # the nav count


def test_queue_filters_by_kind_and_agent(interrupted, policy_paused, operator):
    pay, refund, policy = interrupted("pay"), interrupted("refund"), policy_paused()
    ids = lambda r: [a.pk for a in r.context["items"]]  # noqa: E731
    assert ids(operator.get("/?kind=policy")) == [policy.approval.pk]
    assert ids(operator.get("/?kind=interrupted_side_effect")) == [pay.approval.pk,
                                                                    refund.approval.pk]
    assert ids(operator.get("/?agent=refund")) == [refund.approval.pk]
    assert ids(operator.get("/?kind=reconcile")) == []
    unknown = operator.get("/?kind=nonsense")  # never a silent "everything"
    assert unknown.status_code == 400 and ids(unknown) == []
    assert "There is no kind 'nonsense': choose one of policy" in unescape(
        unknown.content.decode())
    unconfigured = operator.get("/?agent=retired")  # still filters, and says why nothing shows
    assert unconfigured.status_code == 200 and ids(unconfigured) == []
    assert "No agent named 'retired' is configured now" in unescape(
        unconfigured.content.decode())


def test_queue_poll_renders_only_the_list_partial(interrupted, operator):
    interrupted()
    page = operator.get("/?kind=interrupted_side_effect", **HTMX)
    html = page.content.decode()
    assert html.lstrip().startswith('<div id="queue-list"')
    assert "<html" not in html and "<nav" not in html
    # the poll keeps the filter, so a refresh never drops it, and says what it shows
    version = re.search(r'data-version="([^"]+)"', html).group(1)
    assert f'hx-get="/?kind=interrupted_side_effect&amp;seen={version}"' in html
    assert 'hx-trigger="every 3s"' in html
    assert "HX-Request" in page["Vary"]
    # a poll of what it already shows gets nothing back...
    same = operator.get(f"/?kind=interrupted_side_effect&seen={version}", **HTMX)
    assert same.status_code == 204 and same.content == b"" and "no-store" in same["Cache-Control"]
    # ...until an approval is added (or one is decided)
    interrupted()
    moved = operator.get(f"/?kind=interrupted_side_effect&seen={version}", **HTMX)
    assert moved.status_code == 200 and moved.content.decode().count("data-queue-row") == 2
    assert f'data-version="{version}"' not in moved.content.decode()


def test_nav_pending_count_partial(interrupted, operator):
    interrupted()
    interrupted()
    page = operator.get("/pending-count/", **HTMX)
    html = page.content.decode().strip()
    assert html.startswith('<a id="nav-pending"') and ">2<" in html


def test_queue_queries_do_not_grow_with_its_length(interrupted, operator):
    interrupted()
    with sql_log() as one:
        assert len(operator.get("/").context["items"]) == 1
    for _ in range(3):
        interrupted()
    with sql_log() as four:
        assert len(operator.get("/").context["items"]) == 4
    assert len(four) == len(one) <= 8, four


# -- the approval page ---------------------------------------------------------------------------


def test_approval_page_shows_the_request_and_says_the_outcome_is_unknown(interrupted, operator):
    w = interrupted()
    step = Step.objects.get(run_id=w.run.pk, index=1)
    page = operator.get(f"/approvals/{w.approval.pk}/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "the process\n  stopped before its outcome was recorded, so whether it took effect is " \
           "unknown" in html
    assert step.idempotency_key in html and w.approval.digest in html
    assert "<dt>Attempt</dt><dd>1</dd>" in html
    assert w.approval.title in html
    # arguments as readable, escaped, pretty JSON
    assert '{\n  &quot;to&quot;: &quot;&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;' \
           '&quot;\n}' in html
    # the run's step timeline up to this step
    assert [s.index for s in page.context["timeline"].rows] == [1]
    for name in ("approve", "resolve", "reject"):
        assert f'id="decide-{name}"' in html


def test_markup_in_arguments_is_escaped_everywhere(interrupted, operator):
    w = interrupted()
    for url in ("/", f"/approvals/{w.approval.pk}/", f"/runs/{w.run.pk}/", "/runs/"):
        html = operator.get(url).content.decode()
        assert XSS not in html, url
    assert "&lt;script&gt;" in operator.get(f"/approvals/{w.approval.pk}/").content.decode()
    assert "&lt;script&gt;" in operator.get(f"/runs/{w.run.pk}/").content.decode()


def test_policy_approval_offers_no_resolve(policy_paused, operator):
    w = policy_paused()
    html = operator.get(f"/approvals/{w.approval.pk}/").content.decode()
    assert 'id="decide-approve"' in html and 'id="decide-reject"' in html
    assert 'id="decide-resolve"' not in html
    assert "Outcome unknown" not in html


def test_unknown_approval_is_404(operator, sqlite_path):
    assert operator.get("/approvals/999/").status_code == 404


# -- decisions -----------------------------------------------------------------------------------


def test_approve_records_who_and_shows_what_happens_next(interrupted, operator):
    w = interrupted()
    response = decide(operator, w.approval, "approve", note="no charge found")
    assert response.status_code == 302 and response["Location"] == f"/approvals/{w.approval.pk}/"
    approval = Approval.objects.get(pk=w.approval.pk)
    assert (approval.status, approval.decided_by, approval.note) == (
        "approved", "olga", "no charge found")
    assert Run.objects.get(pk=w.run.pk).status == "queued"
    assert Event.objects.get(run_id=w.run.pk, kind="approval.granted").actor == "olga"
    html = operator.get(response["Location"]).content.decode()
    assert "Approved to run once more, not started yet</strong>\n            — decided by olga" \
        in html
    assert "What happens next: The run is queued" in html
    assert operator.get("/").context["items"] == []  # it left the queue


def test_approve_over_htmx_answers_with_the_decision_panel(interrupted, operator):
    w = interrupted()
    response = decide(operator, w.approval, "approve", htmx=True)
    html = response.content.decode().strip()
    assert response.status_code == 200
    # the whole approval, not just its decision: header, banner, steps and outcome agree
    assert html.startswith('<div id="approval-live"') and "decided by olga" in html
    assert 'data-testid="run-status">queued<' in html and "Outcome unknown" not in html
    assert response["HX-Trigger"] == "pending-changed"  # the nav's count follows at once


def test_reject_needs_a_note_and_ends_the_run(interrupted, operator):
    w = interrupted()
    before = snapshot(w.run.pk)
    response = decide(operator, w.approval, "reject", note="  ")
    assert response.status_code == 422
    assert snapshot(w.run.pk) == before
    assert decide(operator, w.approval, "reject", note="customer cancelled").status_code == 302
    run = Run.objects.get(pk=w.run.pk)
    assert (run.status, run.failure_code) == ("failed", "rejected")
    assert Approval.objects.get(pk=w.approval.pk).decided_by == "olga"
    html = operator.get(f"/approvals/{w.approval.pk}/").content.decode()
    assert "will not be called again" in html


def test_resolve_stores_the_parsed_json_result(interrupted, operator):
    w = interrupted()
    result = {"sent": "ok", "id": 7}
    assert decide(operator, w.approval, "resolve", result=json.dumps(result)).status_code == 302
    approval = Approval.objects.get(pk=w.approval.pk)
    assert (approval.status, approval.result, approval.decided_by) == ("resolved", result, "olga")
    assert Step.objects.get(run_id=w.run.pk, index=1).result == result
    assert Run.objects.get(pk=w.run.pk).status == "queued"


@pytest.mark.parametrize(("bad", "message"), [
    ("{not json", "Not valid JSON: Expecting property name"),
    ("", "This field is required"),
    ("{'single': 'quotes'}", "Not valid JSON: Expecting property name"),
    ('{"charged": NaN}', "Not valid JSON: NaN is not a JSON number"),
    ("Infinity", "Not valid JSON: Infinity is not a JSON number"),
])
def test_resolve_with_bad_json_is_a_form_error_and_changes_nothing(interrupted, operator, bad,
                                                                    message):
    w = interrupted()
    before = snapshot(w.run.pk)
    response = decide(operator, w.approval, "resolve", htmx=True, result=bad)
    assert response.status_code == 422
    html = response.content.decode()
    assert message in html
    assert "<details id=\"decide-resolve\" class=\"decision decision-resolve\"\n" \
           "                   open>" in html  # the form stays open with its error
    assert snapshot(w.run.pk) == before


@pytest.mark.parametrize("decision", ["approve", "resolve", "reject"])
def test_every_decision_needs_its_confirmation(interrupted, operator, decision):
    w = interrupted()
    before = snapshot(w.run.pk)
    data = {"decision": decision, f"{decision}-note": "n", f"{decision}-result": "{}"}
    response = operator.post(f"/approvals/{w.approval.pk}/", data)
    assert response.status_code == 422
    assert "Tick the box to confirm." in response.content.decode()
    assert snapshot(w.run.pk) == before


def test_second_decision_gets_409_already_decided_by_and_changes_nothing(
        interrupted, operator, make_user):
    w = interrupted()
    other = client_for(make_user("pat", "runtime.view_run", "runtime.decide_approval"))
    assert decide(other, w.approval, "approve").status_code == 302
    before = snapshot(w.run.pk)
    for htmx in (False, True):
        response = decide(operator, w.approval, "reject", htmx=htmx, note="too late")
        assert response.status_code == 409
        html = response.content.decode()
        decided_at = Approval.objects.get(pk=w.approval.pk).decided_at
        assert re.search(rf"already decided by pat at\s+<time datetime=\"[^\"]+\">"
                         rf"{decided_at:%Y-%m-%d %H:%M:%S} UTC</time>", html)
        assert "Nothing was changed." in html
    assert snapshot(w.run.pk) == before


def test_viewer_sees_no_decision_controls_and_a_forged_post_is_403(interrupted, viewer):
    w = interrupted()
    html = viewer.get(f"/approvals/{w.approval.pk}/").content.decode()
    assert "decide-approve" not in html and "<form method=\"post\" action=\"/approvals" not in html
    assert 'data-testid="no-permission"' in html
    before = snapshot(w.run.pk)
    for decision in ("approve", "resolve", "reject"):
        response = decide(viewer, w.approval, decision, note="x", result="{}")
        assert response.status_code == 403
    assert snapshot(w.run.pk) == before


def test_unknown_decision_is_400(interrupted, operator):
    w = interrupted()
    before = snapshot(w.run.pk)
    assert operator.post(f"/approvals/{w.approval.pk}/", {"decision": "delete"}).status_code == 400
    assert snapshot(w.run.pk) == before


def test_decisions_need_the_csrf_token(interrupted, sqlite_path, make_user):
    from django.test import Client

    w = interrupted()
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("carla", "runtime.view_run", "runtime.decide_approval"))
    data = {"decision": "approve", "approve-confirm": "on"}
    assert client.post(f"/approvals/{w.approval.pk}/", data).status_code == 403
    assert Approval.objects.get(pk=w.approval.pk).status == "pending"
    # htmx sends the token from <body hx-headers>; the same header is accepted
    page = client.get(f"/approvals/{w.approval.pk}/").content.decode()
    token = page.split('"X-CSRFToken": "')[1].split('"')[0]
    response = client.post(f"/approvals/{w.approval.pk}/", data, HTTP_X_CSRFTOKEN=token, **HTMX)
    assert response.status_code == 200
    assert Approval.objects.get(pk=w.approval.pk).status == "approved"


def test_waiting_is_shown(interrupted, operator, clock):
    w: Waiting = interrupted()
    html = operator.get("/").content.decode()
    assert f'data-id="{w.approval.pk}"' in html
    assert 'title="2026-01-01' in html and "data-age" in html


def test_a_null_result_is_recorded_and_shown(interrupted, operator):
    w = interrupted()
    assert decide(operator, w.approval, "resolve", result="null").status_code == 302
    assert Approval.objects.get(pk=w.approval.pk).status == "resolved"
    html = operator.get(f"/approvals/{w.approval.pk}/").content.decode()
    assert "Recorded result:" in html


def test_a_forged_resolve_of_a_policy_approval_is_400_and_changes_nothing(policy_paused,
                                                                         operator):
    w = policy_paused()
    before = snapshot(w.run.pk)
    response = operator.post(f"/approvals/{w.approval.pk}/", {
        "decision": "resolve", "resolve-confirm": "on", "resolve-result": "{}"})
    assert response.status_code == 400
    assert "Resolve applies to interrupted calls only" in response.content.decode()
    assert snapshot(w.run.pk) == before


def test_a_back_button_restore_gets_the_whole_page_and_nothing_is_cached(interrupted,
                                                                        operator):
    interrupted()
    restore = operator.get("/", HTTP_HX_REQUEST="true", HTTP_HX_HISTORY_RESTORE_REQUEST="true")
    assert "<html" in restore.content.decode()
    poll = operator.get("/", HTTP_HX_REQUEST="true")
    assert "<html" not in poll.content.decode()
    assert "no-store" in restore["Cache-Control"] and "private" in restore["Cache-Control"]


def test_a_reconcile_approval_of_a_side_effect_says_the_outcome_is_unknown(operator, tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("RUNTIME_TEST_DIR", str(tmp_path))
    with registry.override(*kit_agents.AGENTS):
        kit = InProcessKit(Ledger(tmp_path / "ledger.jsonl"))
        run = kit.start("reconcile-wait")
        kit.crash(run, Crash(CrashPoint.AFTER_TOOL_EFFECT, step_index=2))
        kit.take_over(run)
    approval = Approval.objects.get(run_id=run, status="pending")
    assert approval.kind == "reconcile"
    assert "Outcome unknown." in operator.get(f"/approvals/{approval.pk}/").content.decode()
