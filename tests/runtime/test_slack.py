"""Approvals in a Slack app's channel (runtime.notifications.slack), against a local fake of
Slack's API: the request posted with a button for each decision its kind allows, the message
updated with the outcome through the outbox, and Slack's errors (HTTP 200, ``ok: false``)
retried as failed attempts that never decide anything."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from django.core.exceptions import ImproperlyConfigured

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
from runtime.approvals.decisions import approve, reject
from runtime.approvals.expiry import approvals_expire
from runtime.crashpoints import CrashPoint
from runtime.models import Approval, Notification
from runtime.notifications.channels import channels
from runtime.notifications.delivery import outbox_deliver_due
from runtime.notifications.slack import SECTION_LIMIT, request_blocks, slack_body
from tests import kit
from tests.kit import Ledger, events, make_tools
from tests.slack_fake import TOKEN, FakeSlack, buttons_of

pytestmark = pytest.mark.engines

CHANNEL = "C0APPROVALS"


@pytest.fixture
def slack(settings) -> Iterator[FakeSlack]:
    fake = FakeSlack()
    settings.RUNTIME = {**settings.RUNTIME, "NOTIFY_BACKOFF_SECONDS": 1.0,
                        "SLACK_BOT_TOKEN": TOKEN, "SLACK_API_URL": fake.url,
                        "APPROVAL_URL": "https://console.example.com/approvals/{id}/",
                        "NOTIFY": [{"name": "ops", "kind": "slack_app", "target": CHANNEL}]}
    yield fake
    fake.close()


def policy(request, run):
    return RequireApproval("Charge a card?", "Over the limit <b>&</b>.") \
        if request.tool == "charge" else Allow()


@pytest.fixture
def paused(database, tmp_path, clock):
    """A run paused by its policy before ``charge`` (a pending policy approval)."""
    agent = Agent("slk", ScriptedLLM([ToolCall("charge", {"amount": 9}), FinalAnswer("done")]),
                  make_tools(Ledger(tmp_path / "ledger")), policy=policy)

    def make() -> Approval:
        run = resume(start("slk", {}, clock=clock).pk, clock=clock, lease_seconds=5)
        assert run.status == "waiting"
        return Approval.objects.get(run_id=run.pk)

    with registry.override(agent):
        yield make


@pytest.fixture
def interrupted(database, tmp_path, clock):
    """A run whose ``send`` went out and was interrupted before its result was recorded."""
    agent = Agent("slk-send", ScriptedLLM([ToolCall("send", {"to": "ops@example.com"}),
                                           FinalAnswer("done")]),
                  make_tools(Ledger(tmp_path / "ledger")))

    def arm(point, step_index):
        crashpoints.arm([crashpoints.Arm(point, step_index)])

    def make() -> Approval:
        run = start("slk-send", {}, clock=clock)
        kit.crash_then_take_over(run.pk, clock, arm, CrashPoint.AFTER_TOOL_EFFECT, 1)
        return Approval.objects.get(run_id=run.pk, status="pending")

    with registry.override(agent):
        yield make


def texts(blocks) -> str:
    """Every text of a message's blocks, joined (what a reader of the channel sees)."""
    out = []
    for b in blocks:
        out += [b["text"]["text"]] if "text" in b else []
        out += [f["text"] for f in b.get("fields", [])]
        out += [e["text"] for e in b.get("elements", []) if b["type"] == "context"]
    return "\n".join(out)


def test_a_request_is_posted_with_the_buttons_its_kind_allows(slack, paused, clock):
    approval = paused()
    assert outbox_deliver_due(clock) == 1
    (posted,) = slack.calls_to("chat.postMessage")
    assert posted["channel"] == CHANNEL
    assert list(buttons_of(posted)) == ["approve", "reject"]  # a policy: allow or deny
    assert [b["text"]["text"] for b in buttons_of(posted).values()] == ["Allow this call", "Deny"]
    for button in buttons_of(posted).values():
        assert json.loads(button["value"]) == {"approval": approval.pk,
                                               "digest": approval.digest}
    shown = texts(posted["blocks"])
    assert "`charge`" in shown and "side_effect" in shown and approval.digest in shown
    assert '"amount": 9' in shown  # the arguments, as the console shows them
    assert "Over the limit &lt;b&gt;&amp;&lt;/b&gt;." in shown  # markup shown as text
    assert f"https://console.example.com/approvals/{approval.pk}/" in shown
    n = Notification.objects.get()
    assert n.status == "delivered"
    assert n.reply == {"channel": CHANNEL, "ts": next(iter(slack.messages))[1]}


def test_an_interrupted_call_offers_three_and_says_what_is_unknown(slack, interrupted, clock):
    approval = interrupted()
    outbox_deliver_due(clock)
    (posted,) = slack.calls_to("chat.postMessage")
    assert [b["text"]["text"] for b in buttons_of(posted).values()] == [
        "Run it once more", "It happened: record the result", "End the run"]
    shown = texts(posted["blocks"])
    assert "Outcome unknown" in shown and approval.step.idempotency_key in shown
    assert '"to": "ops@example.com"' in shown


def test_slack_refusing_is_a_failed_attempt_retried_and_decides_nothing(slack, paused, clock):
    """Slack answers HTTP 200 with ``ok: false``: not delivered, retried, nothing decided."""
    approval = paused()
    slack.refuse("chat.postMessage", "channel_not_found", "ratelimited")
    assert outbox_deliver_due(clock) == 0
    n = Notification.objects.get()
    assert (n.status, n.reply) == ("pending", {})
    assert "channel_not_found" in n.last_error
    clock.advance(5)
    assert outbox_deliver_due(clock) == 0 and "ratelimited" in Notification.objects.get().last_error
    clock.advance(5)
    assert outbox_deliver_due(clock) == 1
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.decided_by == ""
    assert events(approval.run_id, "approval.granted") == []
    assert len(slack.calls_to("chat.postMessage")) == 3 and len(slack.messages) == 1


def test_a_wrong_token_is_a_failed_attempt(settings, slack, paused, clock):
    settings.RUNTIME = {**settings.RUNTIME, "SLACK_BOT_TOKEN": "xoxb-not-the-right-one"}
    paused()
    assert outbox_deliver_due(clock) == 0
    assert "invalid_auth" in Notification.objects.get().last_error


def test_the_outcome_updates_the_posted_message(slack, paused, clock):
    approval = paused()
    outbox_deliver_due(clock)
    ((channel, ts),) = slack.messages
    clock.advance(60)
    approve(approval.pk, "olga", now=clock.now())
    assert outbox_deliver_due(clock) == 1
    (update,) = slack.calls_to("chat.update")
    assert (update["channel"], update["ts"]) == (channel, ts)
    now = slack.messages[(channel, ts)]
    assert buttons_of(now) == {}  # the buttons are gone for everyone
    shown = texts(now["blocks"])
    assert "Allowed by olga at" in shown and f"{clock.now():%H:%M} UTC" in shown
    assert "`charge`" in shown  # the request stays readable
    assert len(slack.calls_to("chat.postMessage")) == 1  # updated, not posted again


def test_a_rejection_shows_the_note_and_an_expiry_says_so(settings, slack, paused, interrupted,
                                                           clock):
    first = paused()
    reject(first.pk, "pete", "not this <card>", now=clock.now())
    settings.RUNTIME = {**settings.RUNTIME, "APPROVAL_EXPIRES_SECONDS": {"*": 60}}
    second = interrupted()
    clock.advance(120)
    assert approvals_expire(clock.now()) == [second.pk]
    while outbox_deliver_due(clock):
        pass
    by_ts = {n.approval_id: n.reply["ts"] for n in Notification.objects.filter(
        event="approval.requested")}
    shown = {a: texts(slack.messages[(CHANNEL, ts)]["blocks"]) for a, ts in by_ts.items()}
    assert "Denied by pete at" in shown[first.pk] and "not this &lt;card&gt;" in shown[first.pk]
    assert "Expired at" in shown[second.pk] and "nobody decided" in shown[second.pk]


def test_an_update_waits_for_its_request_to_be_posted(slack, paused, clock):
    """The request's message failed to post; the outcome is decided meanwhile: the update is
    retried until the message exists, and then updates it (no second message)."""
    approval = paused()
    slack.refuse("chat.postMessage", "service_unavailable")
    approve(approval.pk, "olga", now=clock.now())
    for _ in range(6):
        outbox_deliver_due(clock)
        clock.advance(3)
    assert set(Notification.objects.values_list("status", flat=True)) == {"delivered"}
    ((channel, ts),) = slack.messages
    (update,) = [u for u in slack.calls_to("chat.update")]
    assert (update["channel"], update["ts"]) == (channel, ts)
    assert "Allowed by olga" in texts(slack.messages[(channel, ts)]["blocks"])


def test_long_arguments_are_cut_to_slacks_limit_and_say_so(slack, paused):
    approval = paused()
    approval.arguments = {"memo": "<x>" * 4000}
    blocks = request_blocks(approval, "https://console.example.com/approvals/1/")
    (arguments,) = [b for b in blocks if "*Arguments*" in b.get("text", {}).get("text", "")]
    assert len(arguments["text"]["text"]) <= SECTION_LIMIT
    assert "characters more: the console shows them all" in arguments["text"]["text"]
    assert "<x>" not in arguments["text"]["text"]


def test_a_slack_app_channel_needs_a_channel_id_and_hears_every_outcome(settings, database):
    settings.RUNTIME = {**settings.RUNTIME, "NOTIFY": [
        {"name": "ops", "kind": "slack_app", "target": CHANNEL}]}
    (channel,) = channels()
    assert channel.events >= {"approval.requested", "approval.decided", "approval.expired"}
    settings.RUNTIME = {**settings.RUNTIME, "NOTIFY": [
        {"name": "ops", "kind": "slack_app", "target": "https://hooks.slack.com/x"}]}
    with pytest.raises(ImproperlyConfigured, match="not a Slack channel id"):
        channels()


def test_a_deadline_warning_the_channel_asks_for_is_a_message_of_its_own(slack, paused):
    approval = paused()
    body = slack_body(CHANNEL, "approval.expiring", approval, "https://c.example/a/1/",
                      "Approval 1 expires in 14 min <soon>")
    # The plain text is mrkdwn too (notifications show it): escaped like the blocks.
    assert "update" not in body and body["text"] == "Approval 1 expires in 14 min &lt;soon&gt;"
    assert "expires in 14 min &lt;soon&gt;" in texts(body["blocks"])
    assert buttons_of(body) == {}
