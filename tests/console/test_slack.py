"""Deciding from Slack (console/slack.py) against a local fake of Slack: a signed button press
decides once, through the runtime, as the mapped console user; every refusal (a bad signature,
an old timestamp, an unmapped user, a user without the permission, the run's starter under
four-eyes, a stale digest) changes nothing and says why; the message is updated for everyone;
two people pressing at once give one decision and one "already ... by"."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from console import slack as endpoint
from console import wording
from runtime import (
    Agent,
    Allow,
    FinalAnswer,
    RequireApproval,
    ScriptedLLM,
    ToolCall,
    crashpoints,
    resume,
    start,
)
from runtime.agents.agent import registry
from runtime.approvals.rules import Decision
from runtime.canonical import request_digest
from runtime.crashpoints import CrashPoint
from runtime.models import Approval, Event, Notification
from runtime.notifications import slack as words
from runtime.notifications.delivery import outbox_deliver_due
from tests import kit
from tests.kit import Background, Ledger, events, make_tools, verifyaudit
from tests.slack_fake import SECRET, TOKEN, FakeSlack, buttons_of, press, signed, submit

pytestmark = pytest.mark.engines

CHANNEL = "C0APPROVALS"
URL = "/slack/interactions"
PEOPLE = {"U0OLGA": "olga", "U0PETE": "pete", "U0VIC": "victor", "U0SAM": "sam",
          "U0DEE": "dee"}


@pytest.fixture
def slack(settings, database, clock, monkeypatch) -> Iterator[FakeSlack]:
    fake = FakeSlack()
    settings.RUNTIME = {**settings.RUNTIME, "SLACK_BOT_TOKEN": TOKEN, "SLACK_API_URL": fake.url,
                        "SLACK_SIGNING_SECRET": SECRET, "SLACK_USERS": PEOPLE,
                        "FOUR_EYES": True,
                        "NOTIFY": [{"name": "ops", "kind": "slack_app", "target": CHANNEL}]}
    monkeypatch.setattr(endpoint, "clock", clock)
    for name in ("olga", "pete", "sam"):
        _user(name, "view_run", "decide_approval")
    _user("victor", "view_run")
    _user("dee", "decide_approval")  # may decide, may not see runs: as on the console, no
    yield fake
    fake.close()


def _user(name: str, *perms: str) -> None:
    user = User.objects.create_user(name)
    for perm in perms:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="runtime",
                                                         codename=perm))


def charge_policy(request, run):
    return RequireApproval("Charge a card?", "") if request.tool == "charge" else Allow()


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    return Ledger(tmp_path / "ledger")


@pytest.fixture
def posted(slack, clock, ledger) -> Iterator[Any]:
    """A run started by sam, paused by its policy before ``charge``; its Slack message
    posted. Returns (approval, message)."""
    agent = Agent("slk", ScriptedLLM([ToolCall("charge", {"amount": 9}), FinalAnswer("done")]),
                  make_tools(ledger), policy=charge_policy)

    def make() -> tuple[Approval, dict[str, Any]]:
        run = resume(start("slk", {}, created_by="sam", clock=clock).pk, clock=clock,
                     lease_seconds=5)
        assert run.status == "waiting"
        assert outbox_deliver_due(clock) == 1
        approval = Approval.objects.get(run_id=run.pk)
        return approval, slack.calls_to("chat.postMessage")[-1]

    with registry.override(agent):
        yield make


@pytest.fixture
def interrupted(slack, clock, ledger) -> Iterator[Any]:
    """A run whose ``send`` went out and was interrupted; its Slack message posted."""
    agent = Agent("slk-send", ScriptedLLM([ToolCall("send", {"to": "ops@example.com"}),
                                           FinalAnswer("done")]), make_tools(ledger))

    def arm(point, step_index):
        crashpoints.arm([crashpoints.Arm(point, step_index)])

    def make() -> tuple[Approval, dict[str, Any]]:
        run = start("slk-send", {}, clock=clock)
        kit.crash_then_take_over(run.pk, clock, arm, CrashPoint.AFTER_TOOL_EFFECT, 1)
        outbox_deliver_due(clock)
        approval = Approval.objects.get(run_id=run.pk, status="pending")
        return approval, slack.calls_to("chat.postMessage")[-1]

    with registry.override(agent):
        yield make


def send(payload: dict[str, Any], clock, *, age: int = 0, secret: str = SECRET,
         client: Client | None = None) -> Any:
    stamp = int(clock.now().timestamp()) - age
    return (client or Client()).post(URL, **signed(payload, stamp, secret))


def unchanged(approval: Approval) -> None:
    """Nothing was decided: the approval waits, its run has no decision event, no outcome was
    enqueued."""
    fresh = Approval.objects.get(pk=approval.pk)
    assert (fresh.status, fresh.decided_by) == ("pending", "")
    assert Event.objects.filter(run_id=approval.run_id, kind__in=(
        "approval.granted", "approval.rejected", "approval.resolved")).count() == 0
    assert not Notification.objects.filter(approval_id=approval.pk,
                                           event="approval.decided").exists()


def test_a_signed_press_decides_once_and_the_message_is_updated(slack, posted, clock):
    approval, message = posted()
    assert "Four-eyes: sam started this run" in json.dumps(message["blocks"])
    reply = send(press(message, "approve", "U0OLGA", slack.response_url()), clock)
    assert reply.status_code == 200
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by, approval.decided_at) == (
        "approved", "olga", clock.now())
    assert len(events(approval.run_id, "approval.granted")) == 1
    (said,) = slack.said()
    assert said.startswith("Done: allowed by olga at")
    assert outbox_deliver_due(clock) == 1  # the outcome, to the channel
    (update,) = slack.calls_to("chat.update")
    now = slack.messages[(update["channel"], update["ts"])]
    assert buttons_of(now) == {} and "Allowed by olga at" in json.dumps(now["blocks"])
    # Pressed again, by someone else, on the message still showing buttons on their screen.
    send(press(message, "approve", "U0PETE", slack.response_url(2)), clock)
    assert slack.said()[1].startswith("Already allowed by olga at")
    assert len(events(approval.run_id, "approval.granted")) == 1
    assert verifyaudit().startswith("ok:")


def test_a_response_url_that_is_not_slacks_is_never_called(slack, posted, clock):
    """The signed payload names where to tell the person; only Slack's hooks (or the
    configured API's host) are told, so a payload cannot make the console call another host.
    The decision itself still stands."""
    elsewhere = FakeSlack()
    try:
        approval, message = posted()
        for url in (elsewhere.response_url(), "file:///etc/passwd", "https://hooks.slack.com.evil/x",
                    "http://hooks.slack.com/actions/T1/2/x", "not a url"):
            send(press(message, "approve", "U0PETE", url), clock)
        assert elsewhere.said() == [] and slack.said() == []
        approval.refresh_from_db()
        assert (approval.status, approval.decided_by) == ("approved", "pete")
        assert words.slack_response_url_allowed("https://hooks.slack.com/actions/T1/2/abc")
        assert words.slack_response_url_allowed(slack.response_url())
    finally:
        elsewhere.close()


def _stale(message: dict[str, Any], approval: Approval) -> str:
    """The button of a message about another request (the same approval, other arguments)."""
    return json.dumps({"approval": approval.pk, "digest": request_digest(
        approval.tool, {"amount": 9000}, approval.effect)})


@pytest.mark.parametrize("case,status,answer", [
    ("bad signature", 401, "not signed with this app's signing secret"),
    ("old timestamp", 401, "more than five minutes"),
    ("unmapped user", 200, "is not mapped to a console user"),
    ("no permission", 200, "victor may not decide approvals"),
    ("cannot see runs", 200, "dee may not decide approvals (the view_run permission"),
    ("four-eyes", 200, "You started run"),
    ("stale digest", 200, "its digest differs"),
])
def test_each_refusal_changes_nothing_and_says_why(slack, posted, clock, case, status, answer):
    approval, message = posted()
    user = {"unmapped user": "U0NOBODY", "no permission": "U0VIC", "four-eyes": "U0SAM",
            "cannot see runs": "U0DEE"}.get(
        case, "U0OLGA")
    payload = press(message, "approve", user, slack.response_url(),
                    value=_stale(message, approval) if case == "stale digest" else None)
    reply = send(payload, clock, age=301 if case == "old timestamp" else 0,
                 secret="0" * 32 if case == "bad signature" else SECRET)
    assert reply.status_code == status
    if status == 401:  # Slack did not send it: nobody to tell but the sender
        assert answer in reply.content.decode() and slack.said() == []
    else:  # told privately to the person who pressed
        (said,) = slack.said()
        assert answer in said and said.endswith("Nothing was changed.")
    unchanged(approval)
    assert outbox_deliver_due(clock) == 0 and slack.calls_to("chat.update") == []


def test_the_starter_may_still_end_the_run_under_four_eyes(slack, posted, clock):
    approval, message = posted()
    send(press(message, "reject", "U0SAM", slack.response_url()), clock)
    (opened,) = slack.calls_to("views.open")
    assert opened["trigger_id"] == "trigger-U0SAM"
    send(submit(opened["view"], "U0SAM", note="wrong customer"), clock)
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by, approval.note) == (
        "rejected", "sam", "wrong customer")


def test_recording_the_result_asks_for_it_in_a_form(slack, interrupted, clock, ledger):
    approval, message = interrupted()
    assert ledger.count("send") == 1  # the interrupted call went out once
    send(press(message, "resolve", "U0OLGA", slack.response_url()), clock)
    (opened,) = slack.calls_to("views.open")
    view = opened["view"]
    assert view["title"]["text"] == "Record the result"
    assert [b.get("block_id") for b in view["blocks"]][1:] == ["result", "note"]
    unchanged(approval)  # opening the form decides nothing
    bad = send(submit(view, "U0OLGA", result="{not json"), clock)
    assert bad.json()["response_action"] == "errors"
    assert "Not valid JSON" in bad.json()["errors"]["result"]
    unchanged(approval)
    good = send(submit(view, "U0OLGA", result='{"sent": "ops@example.com"}', note="seen"), clock)
    assert good.status_code == 200 and good.content == b""  # the form closes
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by, approval.result) == (
        "resolved", "olga", {"sent": "ops@example.com"})
    assert slack.said() == [f"Done: recorded as happened by olga at "
                            f"{words.slack_time(clock.now())}. The message in the channel will "
                            "show it to everyone."]
    assert ledger.count("send") == 1  # recorded as happened, not called again


def test_ending_the_run_needs_a_note(slack, interrupted, clock):
    approval, message = interrupted()
    send(press(message, "reject", "U0PETE", slack.response_url()), clock)
    (opened,) = slack.calls_to("views.open")
    empty = send(submit(opened["view"], "U0PETE", note="  "), clock)
    assert empty.json() == {"response_action": "errors",
                            "errors": {"note": "Required: why the run must stop."}}
    unchanged(approval)


def test_a_form_about_a_request_decided_meanwhile_says_who_decided(slack, interrupted, clock):
    approval, message = interrupted()
    send(press(message, "reject", "U0PETE", slack.response_url()), clock)
    (opened,) = slack.calls_to("views.open")
    send(press(message, "approve", "U0OLGA", slack.response_url(2)), clock)
    late = send(submit(opened["view"], "U0PETE", note="stop"), clock)
    assert "Already approved to run once more by olga at" in late.json()["errors"]["note"]
    assert Approval.objects.get(pk=approval.pk).status == "approved"


def test_two_people_pressing_at_once_give_one_decision(slack, posted, clock):
    approval, message = posted()
    together = threading.Barrier(2, timeout=30)

    def pressing(user: str, n: int) -> Any:
        payload = press(message, "approve", user, slack.response_url(n))
        client = Client()
        together.wait()
        return send(payload, clock, client=client)

    both = [Background(lambda u=u, n=n: pressing(u, n)) for n, u in
            enumerate(("U0OLGA", "U0PETE"), 1)]
    for b in both:
        assert b.join().error is None and b.result.status_code == 200
    approval.refresh_from_db()
    winner = approval.decided_by
    assert approval.status == "approved" and winner in ("olga", "pete")
    assert len(events(approval.run_id, "approval.granted")) == 1
    said = sorted(slack.said())
    assert said[0].startswith(f"Already allowed by {winner} at")
    assert said[1].startswith(f"Done: allowed by {winner} at")
    assert verifyaudit().startswith("ok:")


def test_without_a_signing_secret_there_is_no_endpoint(settings, database):
    settings.RUNTIME = {**settings.RUNTIME, "SLACK_SIGNING_SECRET": ""}
    assert Client().post(URL, data="payload=%7B%7D",
                         content_type="application/x-www-form-urlencoded").status_code == 404


def test_a_body_over_the_limit_is_refused(slack, clock):
    payload = {"type": "block_actions", "padding": "x" * endpoint.MAX_BODY}
    reply = send(payload, clock)
    assert reply.status_code == 413


def test_get_is_not_allowed(slack):
    assert Client().get(URL).status_code == 405


def test_slack_words_are_the_consoles(database):
    for kind, buttons, confirm, submits in (
            ("policy", words.POLICY_BUTTONS, words.POLICY_CONFIRM, words.POLICY_SUBMIT),
            ("interrupted_side_effect", words.RERUN_BUTTONS, words.RERUN_CONFIRM,
             words.RERUN_SUBMIT)):
        choices = wording.choices(Approval(kind=kind))
        assert set(choices) == set(buttons)
        for d in choices:
            assert (buttons[d], confirm[d], submits[d]) == (
                choices[d].summary, choices[d].confirm, choices[d].button)
    assert set(words.KIND_WORDS) == set(wording.KIND_WORDS) and all(
        words.KIND_WORDS[k] == wording.KIND_WORDS[k] for k in wording.KIND_WORDS)
    assert Decision.RESOLVE not in words.POLICY_BUTTONS


def test_a_form_slack_would_not_open_says_so_and_decides_nothing(slack, interrupted, clock):
    approval, message = interrupted()
    slack.refuse("views.open", "expired_trigger_id")
    send(press(message, "reject", "U0PETE", slack.response_url()), clock)
    (said,) = slack.said()
    assert "expired_trigger_id" in said and said.endswith("Nothing was changed.")
    unchanged(approval)


@pytest.mark.parametrize("payload", [
    {"type": "block_actions", "actions": {"0": 1}, "user": "U0OLGA"},
    {"type": "block_actions", "actions": [{"action_id": "approve", "value": "{}"}],
     "user": {"id": "U0OLGA"}},
    {"type": "block_actions", "actions": [{"action_id": "approve", "value": [1]}],
     "user": {"id": "U0OLGA"}},
    {"type": "view_submission", "view": {"private_metadata": "[]", "state": 3}},
    {"type": "view_submission", "view": "x"},
    {"type": "shortcut"},
    {"type": "block_actions", "user": {"id": "U0OLGA"},
     "actions": [{"action_id": "approve", "value": '{"approval": Infinity, "digest": "x"}'}]},
    {"type": "block_actions", "user": {"id": "U0OLGA"},
     "actions": [{"action_id": "approve", "value": '{"approval": 1e30, "digest": "x"}'}]},
])
def test_a_malformed_signed_payload_changes_nothing(slack, posted, clock, payload):
    approval, _ = posted()
    assert send(payload, clock).status_code == 200
    unchanged(approval)


def test_a_title_cannot_ping_the_channel_or_hide_a_link(slack, clock, ledger):
    """A policy's title may hold what the model asked for: in the message's plain ``text``
    (what notifications show) Slack's control characters are escaped as in its blocks, so
    ``<!channel>`` or a disguised link in it stays text."""
    sly = "<!channel> pay <https://evil.example|the usual> & go"

    def policy(request, run):
        return RequireApproval(sly, "") if request.tool == "charge" else Allow()

    agent = Agent("slk-sly", ScriptedLLM([ToolCall("charge", {"amount": 9}),
                                          FinalAnswer("done")]), make_tools(ledger),
                  policy=policy)
    with registry.override(agent):
        run = resume(start("slk-sly", {}, clock=clock).pk, clock=clock, lease_seconds=5)
        assert outbox_deliver_due(clock) == 1
        approval = Approval.objects.get(run_id=run.pk)
        message = slack.calls_to("chat.postMessage")[-1]
        send(press(message, "reject", "U0OLGA", slack.response_url()), clock)
        (opened,) = slack.calls_to("views.open")
        send(submit(opened["view"], "U0OLGA", note="no"), clock)
        assert Approval.objects.get(pk=approval.pk).status == "rejected"
        assert outbox_deliver_due(clock) == 1
    (update,) = slack.calls_to("chat.update")
    for text in (message["text"], update["text"]):
        assert "<!channel>" not in text and "<https://evil" not in text
        assert "&lt;!channel&gt; pay &lt;https://evil.example|the usual&gt; &amp; go" in text
    assert "<!date^" in update["text"]  # the outcome's time is still Slack's own markup


@pytest.mark.parametrize("mapping", [["U0OLGA"], "U0OLGA=olga", {"U0OLGA": ["olga"]}])
def test_a_slack_users_setting_of_the_wrong_shape_refuses_clearly(slack, posted, clock,
                                                                   settings, mapping):
    """``RUNTIME["SLACK_USERS"]`` not a mapping of user id to user name: the person is told
    an admin must fix it, nothing is decided (not a 500 that Slack retries)."""
    approval, message = posted()
    settings.RUNTIME = {**settings.RUNTIME, "SLACK_USERS": mapping}
    reply = send(press(message, "approve", "U0OLGA", slack.response_url()), clock)
    assert reply.status_code == 200
    (said,) = slack.said()
    assert "SLACK_USERS" in said and said.endswith("Nothing was changed.")
    unchanged(approval)


def test_a_body_that_is_not_utf8_is_refused_as_unsigned(slack, clock):
    """Bytes that are not UTF-8 cannot be what Slack signed: a 401 like any other unsigned
    request, not a server error."""
    stamp = str(int(clock.now().timestamp()))
    reply = Client().post(URL, data=b"payload=\xff\xfe", content_type="application/x-www-form-"
                          "urlencoded", headers={"X-Slack-Request-Timestamp": stamp,
                                                 "X-Slack-Signature": "v0=" + "0" * 64})
    assert reply.status_code == 401
    assert "not signed" in reply.content.decode()


def test_a_signature_header_that_is_not_ascii_is_refused_as_unsigned(slack, posted, clock):
    approval, message = posted()
    payload = signed(press(message, "approve", "U0OLGA", slack.response_url()),
                     int(clock.now().timestamp()))
    payload["headers"]["X-Slack-Signature"] = "v0=\u00e9" + "0" * 63
    reply = Client().post(URL, **payload)
    assert reply.status_code == 401 and "not signed" in reply.content.decode()
    unchanged(approval)


@pytest.mark.parametrize("stamp", ["9" * 400, "-" + "9" * 400, "", "1e9", "soon"])
def test_a_timestamp_that_is_no_time_is_refused(slack, posted, clock, stamp):
    """A timestamp too large for a float (or not a number) is refused with a 401 that says
    so, not a server error."""
    approval, message = posted()
    payload = signed(press(message, "approve", "U0OLGA", slack.response_url()),
                     int(clock.now().timestamp()))
    payload["headers"]["X-Slack-Request-Timestamp"] = stamp
    reply = Client().post(URL, **payload)
    assert reply.status_code == 401 and "X-Slack-Request-Timestamp" in reply.content.decode()
    unchanged(approval)


def test_an_edited_call_s_message_shows_what_it_was_allowed_with(slack, posted, clock, ledger):
    """Allowed with edited arguments (in the console): the channel's message, updated with
    the outcome, says who edited and shows the arguments the call runs with, not only the
    proposed ones."""
    from runtime.approvals.decisions import approval_decide

    approval, _ = posted()
    approval_decide(approval.pk, Decision.APPROVE, "olga", "smaller", arguments={"amount": 5},
                    now=clock.now())
    assert outbox_deliver_due(clock) == 1
    (update,) = slack.calls_to("chat.update")
    shown = json.dumps(update["blocks"])
    assert "edited by olga" in shown
    assert '\\"amount\\": 5' in shown and '\\"amount\\": 9' in shown  # effective and proposed
    assert "edited by olga" in update["text"]
