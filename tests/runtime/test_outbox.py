"""Notifications about approvals (runtime.notifications.delivery): written in the transaction that
requests the approval, delivered at least once to a real HTTP server and a real SMTP server on
loopback, retried with backoff, re-sent after a crash between sending and recording, never lost
and never sent for a pause that rolled back. What receivers got is counted by the receivers."""

from __future__ import annotations

import itertools
import json
import signal
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from email.header import decode_header, make_header
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.exceptions import ImproperlyConfigured

from runtime import Agent, Allow, FinalAnswer, RequireApproval, ScriptedLLM, ToolCall, resume, start
from runtime.agents.agent import registry
from runtime.approvals.decisions import approve
from runtime.approvals.expiry import approvals_expire
from runtime.crashpoints import CrashPoint
from runtime.errors import SimulatedCrash
from runtime.models import Approval, Notification, NotificationAttempt
from runtime.notifications.channels import channels
from runtime.notifications.delivery import CLAIM_SECONDS, OutboxSender, outbox_deliver_due
from tests.kit import Ledger, make_tools
from tests.waiting import wait_until

pytestmark = pytest.mark.engines


class Receiver:
    """A webhook receiver on 127.0.0.1: answers ``fail_first`` requests with 500, then 200;
    keeps every request it got (headers and JSON body)."""

    def __init__(self, fail_first: int = 0) -> None:
        self.fail_first, self.got = fail_first, []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver.lock:
                    receiver.got.append((dict(self.headers), body))
                    failing = len(receiver.got) <= receiver.fail_first
                self.send_response(500 if failing else 200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def policy(request, run):
    return RequireApproval("Charge a card?", "over the limit") if request.tool == "charge" \
        else Allow()


@pytest.fixture
def paused(database, tmp_path, clock):
    """Make a run paused by its policy (a pending policy approval); returns the approval."""
    agent = Agent("nt", ScriptedLLM([ToolCall("charge", {"amount": 9}), FinalAnswer("done")]),
                  make_tools(Ledger(tmp_path / "ledger")), policy=policy)

    def make() -> Approval:
        run = resume(start("nt", {}, clock=clock).pk, clock=clock, lease_seconds=5)
        assert run.status == "waiting"
        return Approval.objects.get(run_id=run.pk)

    with registry.override(agent):
        yield make


def notify(settings, target: str, kind: str = "webhook", **extra) -> None:
    settings.RUNTIME = {**settings.RUNTIME, "NOTIFY_BACKOFF_SECONDS": 1.0, "NOTIFY": [
        {"name": "ops", "kind": kind, "target": target, **extra}],
        "APPROVAL_URL": "https://console.example.com/approvals/{id}/"}


def test_a_pause_writes_its_notification_in_the_same_commit(settings, receiver, paused, clock):
    notify(settings, receiver.url)
    approval = paused()
    (n,) = Notification.objects.all()
    assert (n.approval_id, n.event, n.channel, n.status) == (approval.pk, "approval.requested",
                                                             "ops", "pending")
    assert n.created_at == approval.created_at and n.next_attempt_at == approval.created_at
    assert n.body["link"] == f"https://console.example.com/approvals/{approval.pk}/"
    assert n.body["approval"]["arguments_digest"] == approval.digest
    assert n.body["run"] == {"id": approval.run_id, "agent": "nt"}
    assert receiver.got == []  # nothing is sent inside the transaction


def test_no_notification_for_a_pause_that_rolled_back(settings, receiver, paused, crash):
    notify(settings, receiver.url)
    crash(CrashPoint.IN_TRANSACTION, step_index=1)
    with pytest.raises(SimulatedCrash):
        paused()
    assert not Approval.objects.exists() and not Notification.objects.exists()


def test_a_crash_right_after_the_pause_commits_loses_no_notification(settings, receiver, paused,
                                                                     crash, clock):
    """The process that paused dies before anything is sent: the notification is in the
    database with the approval, and any worker's sender delivers it."""
    notify(settings, receiver.url)
    crash(CrashPoint.AFTER_PAUSE, step_index=1)
    with pytest.raises(SimulatedCrash):
        paused()
    approval = Approval.objects.get()
    assert Notification.objects.get().approval_id == approval.pk and receiver.got == []
    assert outbox_deliver_due(clock) == 1
    assert [b["approval"]["id"] for _, b in receiver.got] == [approval.pk]


def test_delivery_to_a_real_http_server_is_recorded(settings, receiver, paused, clock):
    notify(settings, receiver.url)
    approval = paused()
    assert outbox_deliver_due(clock) == 1
    ((headers, body),) = receiver.got
    n = Notification.objects.get()
    assert headers["Idempotency-Key"] == n.idempotency_key == body["idempotency_key"]
    assert body["approval"]["id"] == approval.pk and body["event"] == "approval.requested"
    assert (n.status, n.attempts, n.delivered_at) == ("delivered", 1, clock.now())
    (attempt,) = NotificationAttempt.objects.all()
    assert (attempt.ok, attempt.status_code, attempt.next_attempt_at) == (True, 200, None)
    assert outbox_deliver_due(clock) == 0  # delivered once


def test_a_receiver_that_fails_five_times_gets_it_when_it_recovers(settings, paused, clock):
    down = Receiver(fail_first=5)
    try:
        notify(settings, down.url)
        paused()
        waits = []
        for _ in range(5):
            assert outbox_deliver_due(clock) == 0
            n = Notification.objects.get()
            assert n.status == "pending" and "HTTP 500" in n.last_error
            waits.append((n.next_attempt_at - clock.now()).total_seconds())
            assert outbox_deliver_due(clock) == 0  # not before its next try
            clock.advance(waits[-1])
        assert outbox_deliver_due(clock) == 1
        assert len(down.got) == 6
        assert len({h["Idempotency-Key"] for h, _ in down.got}) == 1
        assert all(later > earlier for earlier, later in itertools.pairwise(waits))
        attempts = list(NotificationAttempt.objects.order_by("number").values_list(
            "number", "ok", "status_code"))
        assert attempts == [(1, False, 500), (2, False, 500), (3, False, 500), (4, False, 500),
                            (5, False, 500), (6, True, 200)]
    finally:
        down.close()


def test_a_receiver_down_for_an_hour_gets_it_when_it_is_back(settings, paused, clock):
    notify(settings, "http://127.0.0.1:9/nothing-listens-here")
    paused()
    for _ in range(200):  # an hour of retries against a closed port
        outbox_deliver_due(clock)
        clock.advance(60)
        if clock.now() - Notification.objects.get().created_at > timedelta(hours=1):
            break
    n = Notification.objects.get()
    assert n.status == "pending" and n.attempts > 5 and "ConnectError" in n.last_error
    up = Receiver()
    try:
        Notification.objects.filter(pk=n.pk).update(target=up.url)  # the receiver is back
        clock.advance((n.next_attempt_at - clock.now()).total_seconds())
        assert outbox_deliver_due(clock) == 1
        assert len(up.got) == 1
    finally:
        up.close()


def test_a_crash_between_sending_and_recording_sends_again(settings, receiver, paused, clock,
                                                           crash):
    notify(settings, receiver.url)
    paused()
    crash(CrashPoint.AFTER_NOTIFICATION_SENT)
    with pytest.raises(SimulatedCrash):
        outbox_deliver_due(clock)
    n = Notification.objects.get()
    assert len(receiver.got) == 1 and n.status == "pending" and n.attempts == 1
    assert not NotificationAttempt.objects.exists()
    assert outbox_deliver_due(clock) == 0  # claimed by the dead sender until its claim lapses
    clock.advance(CLAIM_SECONDS)
    assert outbox_deliver_due(clock) == 1
    assert len(receiver.got) == 2  # at least once: the receiver drops the repeat by its key
    assert receiver.got[0][0]["Idempotency-Key"] == receiver.got[1][0]["Idempotency-Key"]
    assert Notification.objects.get().status == "delivered"


def test_decisions_and_expiry_notify_when_a_channel_asks(settings, receiver, paused, clock):
    notify(settings, receiver.url,
           events=["approval.requested", "approval.decided", "approval.expired"])
    first = paused()
    approve(first.pk, by="alice", now=clock.now())
    events = list(Notification.objects.filter(approval_id=first.pk).order_by("pk")
                  .values_list("event", flat=True))
    assert events == ["approval.requested", "approval.decided"]
    decided = Notification.objects.get(approval_id=first.pk, event="approval.decided")
    assert decided.body["approval"]["status"] == "approved"
    assert decided.body["approval"]["decided_by"] == "alice"
    second = paused()
    Approval.objects.filter(pk=second.pk).update(expires_at=clock.now())
    assert approvals_expire(clock.now()) == [second.pk]
    assert Notification.objects.filter(approval_id=second.pk, event="approval.expired").exists()
    assert outbox_deliver_due(clock) == 4
    assert sorted(b["event"] for _, b in receiver.got) == [
        "approval.decided", "approval.expired", "approval.requested", "approval.requested"]


def test_channels_for_some_agents_only(settings, receiver, paused):
    notify(settings, receiver.url, agents=["someone-else"])
    paused()
    assert not Notification.objects.exists()


def test_slack_and_email_bodies(settings, paused):
    settings.RUNTIME = {**settings.RUNTIME, "NOTIFY": [
        {"name": "chat", "kind": "slack", "target": "https://hooks.example.com/x"},
        {"name": "mail", "kind": "email", "target": "ops@example.com, lead@example.com"}],
        "APPROVAL_URL": "https://c.example.com/approvals/{id}/"}
    approval = paused()
    slack = Notification.objects.get(channel="chat").body
    assert set(slack) == {"text"} and f"/approvals/{approval.pk}/|Open the approval>" in \
        slack["text"]
    mail = Notification.objects.get(channel="mail").body
    assert "Charge a card?" in mail["subject"]
    assert f"https://c.example.com/approvals/{approval.pk}/" in mail["text"]


def test_email_through_a_real_smtp_server_on_loopback(settings, paused, clock):
    from aiosmtpd.controller import Controller
    from aiosmtpd.handlers import Message

    got = []

    class Keep(Message):
        def handle_message(self, message) -> None:
            got.append(message)

    with socket.socket() as probe:  # a free port on loopback
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = Controller(Keep(), hostname="127.0.0.1", port=port)
    server.start()
    try:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
        notify(settings, "ops@example.com", kind="email")
        approval = paused()
        assert outbox_deliver_due(clock) == 1
    finally:
        server.stop()
    (message,) = got
    subject = " ".join(str(make_header(decode_header(message["Subject"]))).split())  # unfolded
    assert message["To"] == "ops@example.com" and "Charge a card?" in subject
    assert f"/approvals/{approval.pk}/" in message.get_payload()


def test_the_worker_thread_delivers_and_stops(settings, receiver, paused):
    from runtime.clock import SYSTEM_CLOCK

    notify(settings, receiver.url)
    paused()
    sender = OutboxSender(SYSTEM_CLOCK, interval=0.05)
    sender.start()
    try:
        for _ in range(200):
            if Notification.objects.get().status == "delivered":
                break
            sender.stopping.wait(0.05)
    finally:
        sender.stop()
        sender.join(timeout=5)
    assert not sender.is_alive()
    assert Notification.objects.get().status == "delivered" and len(receiver.got) == 1


@pytest.mark.parametrize("bad,message", [
    ({"kind": "pager", "target": "x"}, "kind must be one of"),
    ({"kind": "webhook", "target": ""}, "a target"),
    ({"kind": "webhook", "target": "ftp://x"}, "not an http"),
    ({"kind": "email", "target": "a@b.c", "events": ["run.created"]}, "unknown events"),
])
def test_a_malformed_channel_is_refused_naming_it(settings, bad, message):
    settings.RUNTIME = {**settings.RUNTIME, "NOTIFY": [bad]}
    with pytest.raises(ImproperlyConfigured, match=message):
        channels()


@pytest.mark.slow
def test_a_worker_process_delivers_and_a_sigterm_stops_its_sender(settings, receiver, paused,
                                                                   spawn):
    notify(settings, receiver.url)
    paused()
    worker = spawn("--poll-interval", "0.1", env={"RUNTIME_NOTIFY_WEBHOOK": receiver.url})
    wait_until(lambda: Notification.objects.get().status == "delivered", what="a delivery")
    assert len(receiver.got) == 1
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()
