"""Before an approval's deadline (runtime.approvals.deadlines): a warning to the channels told of
it, then an escalation to a second channel or an email group, each written once (with its
notifications and its audit event, in one transaction) at the right moment of an injected
clock, however many workers sweep at once; nothing for an approval already decided; the expiry
after them is still an expiry (``approval_expired``), never a denial."""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import Client

from console.templatetags.console import utc
from runtime import Agent, Allow, FinalAnswer, RequireApproval, ScriptedLLM, ToolCall, resume, start
from runtime.agents.agent import registry
from runtime.approvals.deadlines import (
    ESCALATION,
    WARNING,
    approvals_escalate,
    approvals_near_deadline,
    approvals_warn,
    deadline_seconds,
)
from runtime.approvals.decisions import approve, reject
from runtime.approvals.expiry import approvals_expire
from runtime.audit.chain import verify
from runtime.clock import ManualClock
from runtime.conf import ConfigError, deadline_problem, runtime_problems, value
from runtime.models import Approval, Notification, Run
from runtime.notifications.channels import channels
from tests.kit import Ledger, events, events_of, make_tools, verifyaudit
from tests.waiting import wait_until

pytestmark = pytest.mark.engines

HOUR = 3600
DEADLINE_EVENTS = ("approval.expiring", "approval.escalated")


def _agent(name: str, ledger: Ledger, expires_in: float | None) -> Agent:
    def policy(request, run):
        if request.tool == "charge":
            return RequireApproval("Charge a card?", "over the limit", expires_in=expires_in)
        return Allow()

    return Agent(name, ScriptedLLM([ToolCall("charge", {"amount": 9}), FinalAnswer("done")]),
                 make_tools(ledger), policy=policy)


def _paused(name: str, clock) -> Approval:
    run = resume(start(name, {}, clock=clock).pk, clock=clock, lease_seconds=5)
    assert run.status == "waiting"
    return Approval.objects.select_related("run").get(run_id=run.pk)


@pytest.fixture
def configured(settings):
    """Warn 15 minutes before, escalate 5 minutes before; channels: ``ops`` (a webhook, the
    default events: requests and warnings), ``chat`` (told of requests only), ``leads`` (an
    email group, escalations only) and ``pager`` (a webhook, escalations only)."""
    settings.RUNTIME = {**settings.RUNTIME, "APPROVAL_WARN_BEFORE": 900,
                        "APPROVAL_ESCALATE_BEFORE": 300,
                        "APPROVAL_URL": "https://console.example.com/approvals/{id}/",
                        "NOTIFY": [
        {"name": "ops", "kind": "webhook", "target": "https://hooks.example.com/ops"},
        {"name": "chat", "kind": "slack", "target": "https://hooks.slack.example/x",
         "events": ["approval.requested"]},
        {"name": "leads", "kind": "email", "group": "leads", "events": ["approval.escalated"]},
        {"name": "pager", "kind": "webhook", "target": "https://hooks.example.com/pager",
         "events": ["approval.escalated"]},
    ]}
    leads = Group.objects.create(name="leads")
    for name, email, active in (("ann", "ann@example.com", True), ("bob", "bob@example.com",
                                True), ("old", "old@example.com", False), ("nomail", "", True)):
        User.objects.create_user(name, email, "x" * 16, is_active=active).groups.add(leads)
    User.objects.create_user("eve", "eve@example.com", "x" * 16)  # not in the group
    return settings


def _told(approval: Approval, event: str) -> dict[str, Notification]:
    found = list(Notification.objects.filter(approval_id=approval.pk, event=event))
    return {n.channel: n for n in found}


def _deadline_notes(approval: Approval) -> list[tuple[str, str]]:
    return sorted(Notification.objects.filter(approval_id=approval.pk, event__in=DEADLINE_EVENTS)
                  .values_list("event", "channel"))


# -- the moments --------------------------------------------------------------------------------


def test_a_warning_then_an_escalation_each_once_then_the_expiry(database, tmp_path, clock,
                                                               configured):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_agent("dl", ledger, HOUR)):
        approval = _paused("dl", clock)
    deadline = approval.expires_at
    warn_at, escalate_at = deadline - timedelta(seconds=900), deadline - timedelta(seconds=300)
    assert set(_told(approval, "approval.requested")) == {"ops", "chat"}

    # Before the warning point: nothing.
    assert approvals_near_deadline(warn_at - timedelta(microseconds=1)) == ([], [])
    assert _deadline_notes(approval) == []
    assert "approval.warned" not in events_of(approval.run_id)

    # At it: one warning per channel that hears warnings (ops by default; chat opted out).
    assert approvals_near_deadline(warn_at) == ([approval.pk], [])
    warned = _told(approval, "approval.expiring")
    assert set(warned) == {"ops"}
    body = warned["ops"].body
    assert body["event"] == "approval.expiring" and body["expires_in_seconds"] == 900
    assert body["link"] == f"https://console.example.com/approvals/{approval.pk}/"
    assert warned["ops"].created_at == warn_at and warned["ops"].next_attempt_at == warn_at
    a = Approval.objects.get(pk=approval.pk)
    assert a.warned_at == warn_at and a.escalated_at is None and a.status == "pending"
    (event,) = events(approval.run_id, "approval.warned")
    assert event.actor == "system" and event.at == warn_at and event.step_index == 1
    assert event.payload["approval_id"] == approval.pk
    assert event.payload["seconds_left"] == 900 and event.payload["notifications"] == 1

    # Later sweeps before the escalation point write nothing more.
    for at in (warn_at, warn_at + timedelta(seconds=1), escalate_at - timedelta(microseconds=1)):
        assert approvals_near_deadline(at) == ([], [])
    assert _deadline_notes(approval) == [("approval.expiring", "ops")]

    # At the escalation point: the channels that ask for escalations, once.
    assert approvals_near_deadline(escalate_at) == ([], [approval.pk])
    assert approvals_near_deadline(escalate_at + timedelta(seconds=10)) == ([], [])
    escalated = _told(approval, "approval.escalated")
    assert set(escalated) == {"leads", "pager"}
    assert escalated["leads"].target == "ann@example.com,bob@example.com"  # the active members
    assert "expires in 5 min" in escalated["leads"].body["text"]
    assert "escalated" in escalated["leads"].body["subject"]
    assert escalated["pager"].body["expires_in_seconds"] == 300
    assert Approval.objects.get(pk=approval.pk).escalated_at == escalate_at
    (event,) = events(approval.run_id, "approval.escalated")
    assert event.payload["seconds_left"] == 300 and event.payload["notifications"] == 2
    assert len(_deadline_notes(approval)) == 3

    # Nobody decided: at the deadline it expires, recorded as an expiry, not a denial.
    assert approvals_expire(deadline) == [approval.pk]
    a = Approval.objects.get(pk=approval.pk)
    assert a.status == "expired" and a.decided_by == ""
    run = Run.objects.get(pk=approval.run_id)
    assert run.status == "failed" and run.failure_code == "approval_expired"
    kinds = events_of(run)
    assert kinds.count("approval.warned") == 1 and kinds.count("approval.escalated") == 1
    assert "approval.expired" in kinds and "approval.rejected" not in kinds
    assert events(run, "run.failed")[0].payload["code"] == "approval_expired"
    assert approvals_near_deadline(deadline + timedelta(seconds=1)) == ([], [])
    assert ledger.count("charge") == 0
    assert verify(run.pk).ok
    assert "problem" not in verifyaudit().lower()


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_an_approval_decided_in_time_is_neither_warned_nor_escalated(database, tmp_path, clock,
                                                                    configured, decision):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_agent("dec", ledger, HOUR)):
        approval = _paused("dec", clock)
        deadline = approval.expires_at
        decided_at = deadline - timedelta(seconds=901)  # just before the warning point
        if decision == "approve":
            approve(approval.pk, by="alice", now=decided_at)
        else:
            reject(approval.pk, by="alice", note="no", now=decided_at)
        for at in (deadline - timedelta(seconds=900), deadline - timedelta(seconds=1)):
            assert approvals_near_deadline(at) == ([], [])
    a = Approval.objects.get(pk=approval.pk)
    assert a.warned_at is None and a.escalated_at is None
    assert _deadline_notes(approval) == []
    kinds = events_of(approval.run_id)
    assert "approval.warned" not in kinds and "approval.escalated" not in kinds
    assert verify(approval.run_id).ok


def test_an_approval_asked_inside_the_window_is_warned_at_once(database, tmp_path, clock,
                                                              configured):
    """A deadline two minutes away is already past both points: the next sweep warns, then
    escalates, and the message says how long is left."""
    with registry.override(_agent("short", Ledger(tmp_path / "ledger"), 120)):
        approval = _paused("short", clock)
    now = clock.now()
    assert approvals_near_deadline(now) == ([approval.pk], [approval.pk])
    assert approvals_near_deadline(now + timedelta(seconds=30)) == ([], [])
    assert _deadline_notes(approval) == [("approval.escalated", "leads"),
                                         ("approval.escalated", "pager"),
                                         ("approval.expiring", "ops")]
    kinds = events_of(approval.run_id)
    assert kinds.index("approval.warned") < kinds.index("approval.escalated")
    leads = _told(approval, "approval.escalated")["leads"].body["text"]
    stamp = f"{approval.expires_at:%Y-%m-%d %H:%M:%S} UTC"
    assert f"expires in 2 min (at {stamp})" in leads
    assert approvals_expire(approval.expires_at) == [approval.pk]
    assert Run.objects.get(pk=approval.run_id).failure_code == "approval_expired"
    assert verify(approval.run_id).ok


def test_approvals_without_a_deadline_or_past_it_are_left_alone(database, tmp_path, clock,
                                                                configured):
    with registry.override(_agent("none", Ledger(tmp_path / "a"), None),
                           _agent("late", Ledger(tmp_path / "b"), 60)):
        forever = _paused("none", clock)
        late = _paused("late", clock)
    past = late.expires_at  # the deadline itself is past it: the expiry's, not a warning's
    assert approvals_near_deadline(past) == ([], [])
    assert approvals_near_deadline(clock.now() + timedelta(days=3650)) == ([], [])
    assert _deadline_notes(forever) == [] and _deadline_notes(late) == []


def test_the_points_can_be_turned_off(database, tmp_path, clock, configured):
    configured.RUNTIME = {**configured.RUNTIME, "APPROVAL_WARN_BEFORE": 0,
                          "APPROVAL_ESCALATE_BEFORE": 0}
    with registry.override(_agent("off", Ledger(tmp_path / "ledger"), 60)):
        approval = _paused("off", clock)
    assert approvals_near_deadline(approval.expires_at - timedelta(seconds=1)) == ([], [])
    configured.RUNTIME = {**configured.RUNTIME, "APPROVAL_WARN_BEFORE": 120}
    assert approvals_escalate(clock.now()) == []  # escalation stays off
    assert approvals_warn(clock.now()) == [approval.pk]
    assert _deadline_notes(approval) == [("approval.expiring", "ops")]


# -- many workers at once ---------------------------------------------------------------------


def test_sweeps_racing_warn_and_escalate_once(database, tmp_path, configured):
    """Four sweeps released together at a barrier, over several approvals: each approval is
    warned once and escalated once, with one notification per channel and one event each."""
    clock = ManualClock()
    with registry.override(_agent("race", Ledger(tmp_path / "ledger"), 600)):
        approvals = [_paused("race", clock) for _ in range(3)]
    at = clock.now() + timedelta(seconds=301)  # past both points (900 and 300 s before)
    for label, sweep, notes in (("warn", approvals_warn, 1), ("escalate", approvals_escalate, 3)):
        barrier = threading.Barrier(4)
        results: list[object] = []
        lock = threading.Lock()

        def run(sweep=sweep, barrier=barrier, results=results, lock=lock) -> None:
            try:
                barrier.wait(timeout=10)
                got: object = sweep(at)
            except BaseException as exc:
                got = exc
            finally:
                connection.close()
            with lock:
                results.append(got)

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert all(isinstance(r, list) for r in results), results
        done = sorted(pk for r in results for pk in r)  # type: ignore[union-attr]
        assert done == sorted(a.pk for a in approvals), label  # each once, by one of them
        for approval in approvals:
            assert len(_deadline_notes(approval)) == notes
    for approval in approvals:
        assert len(_deadline_notes(approval)) == 3
        kinds = events_of(approval.run_id)
        assert kinds.count("approval.warned") == 1 and kinds.count("approval.escalated") == 1
        assert verify(approval.run_id).ok


def test_a_decision_racing_the_warning_never_gets_a_warning_after_it(database, tmp_path,
                                                                     configured):
    """A person approving while the sweep warns, released together: either the warning came
    first (and the decision then wins, or is told to try again, changing nothing), or the
    decision did and no warning is written at all."""
    clock = ManualClock()
    outcomes = []
    with registry.override(_agent("rd", Ledger(tmp_path / "ledger"), HOUR)):
        for _round in range(6):
            approval = _paused("rd", clock)
            at = approval.expires_at - timedelta(seconds=600)
            barrier, got = threading.Barrier(2), {}

            def decide(pk=approval.pk, barrier=barrier, got=got, at=at) -> None:
                try:
                    barrier.wait(timeout=10)
                    got["decision"] = approve(pk, by="alice", now=at)
                except BaseException as exc:  # ApprovalConflict ("retry") is a fair outcome
                    got["decision"] = exc
                finally:
                    connection.close()

            def sweep(barrier=barrier, got=got, at=at) -> None:
                try:
                    barrier.wait(timeout=10)
                    got["warned"] = approvals_warn(at)
                except BaseException as exc:
                    got["warned"] = exc
                finally:
                    connection.close()

            threads = [threading.Thread(target=decide), threading.Thread(target=sweep)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert isinstance(got["warned"], list), got
            kinds = events_of(approval.run_id)
            stored = Approval.objects.get(pk=approval.pk)
            if got["warned"]:
                assert stored.warned_at == at and kinds.count("approval.warned") == 1
                assert _deadline_notes(approval) == [("approval.expiring", "ops")]
                if "approval.granted" in kinds:
                    assert kinds.index("approval.warned") < kinds.index("approval.granted")
                else:
                    assert getattr(got["decision"], "reason_code", "") == "retry", got
                    assert stored.status == "pending"
            else:
                assert isinstance(got["decision"], Approval) and stored.status == "approved"
                assert stored.warned_at is None and "approval.warned" not in kinds
                assert _deadline_notes(approval) == []
            outcomes.append(bool(got["warned"]))
            assert verify(approval.run_id).ok
    assert len(outcomes) == 6


def test_the_console_says_expired_never_denied(database, tmp_path, clock, configured):
    """After a warning, an escalation and the expiry, the approval's and the run's pages say
    "expired" and name ``approval_expired``; nothing calls it denied or rejected."""
    configured.STORAGES = {**configured.STORAGES, "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
    with registry.override(_agent("page", Ledger(tmp_path / "ledger"), HOUR)):
        approval = _paused("page", clock)
    deadline = approval.expires_at
    approvals_near_deadline(deadline - timedelta(seconds=300))
    assert approvals_expire(deadline) == [approval.pk]
    viewer = User.objects.create_user("vic", "vic@example.com", "x" * 16)
    viewer.user_permissions.add(Permission.objects.get(codename="view_run"))
    client = Client()
    client.force_login(User.objects.get(pk=viewer.pk))
    for url in (f"/approvals/{approval.pk}/", f"/runs/{approval.run_id}/"):
        response = client.get(url)
        assert response.status_code == 200, url
        page = response.content.decode().lower()
        assert "expired" in page and "approval_expired" in page, url
        assert "denied" not in page and "rejected" not in page, url


def test_the_approval_page_says_when_it_was_warned_and_escalated(database, tmp_path, clock,
                                                                  configured):
    """A person opening the approval sees when its deadline reminder and escalation went out
    and to how many channels, before and after the expiry; an approval never warned says
    nothing of it."""
    configured.STORAGES = {**configured.STORAGES, "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
    with registry.override(_agent("seen", Ledger(tmp_path / "ledger"), HOUR)):
        approval, quiet = _paused("seen", clock), _paused("seen", clock)
    Approval.objects.filter(pk=quiet.pk).update(expires_at=None)
    viewer = User.objects.create_user("vic", "vic@example.com", "x" * 16)
    viewer.user_permissions.add(Permission.objects.get(codename="view_run"))
    client = Client()
    client.force_login(User.objects.get(pk=viewer.pk))

    def reminders(pk: int) -> str:
        page = client.get(f"/approvals/{pk}/").content.decode()
        found = re.search(r'data-testid="deadline-reminders">(.*?)</p>', page, re.S)
        return " ".join(found[1].split()) if found else ""

    assert reminders(approval.pk) == ""
    warned_at = approval.expires_at - timedelta(seconds=900)
    approvals_near_deadline(warned_at)
    assert reminders(approval.pk) == (f"Deadline reminder at {utc(warned_at)}: sent to 1 "
                                      "channel (see Who was told).")
    escalated_at = approval.expires_at - timedelta(seconds=300)
    approvals_near_deadline(escalated_at)
    approvals_expire(approval.expires_at)
    assert reminders(approval.pk) == (
        f"Deadline reminder at {utc(warned_at)}: sent to 1 channel (see Who was told). "
        f"Escalated at {utc(escalated_at)}: sent to 2 channels (see Who was told).")
    assert reminders(quiet.pk) == ""


@pytest.mark.slow
def test_a_worker_process_warns_on_its_own(database, tmp_path, spawn):
    """The worker's housekeeping sweeps deadlines too, with the outbox's receiver connected in
    its process: the warning's notification is written there."""
    with registry.override(_agent("wdl", Ledger(tmp_path / "ledger"), 600)):
        run = resume(start("wdl", {}).pk, lease_seconds=5)  # the system clock: the worker's
    approval = Approval.objects.get(run_id=run.pk)
    worker = spawn("--poll-interval", "0.2", env={
        "RUNTIME_APPROVAL_WARN_BEFORE": "3600", "RUNTIME_APPROVAL_ESCALATE_BEFORE": "0",
        "RUNTIME_NOTIFY_WEBHOOK": "http://127.0.0.1:9/hook"})
    wait_until(lambda: Approval.objects.get(pk=approval.pk).warned_at is not None, timeout=30,
               what="the worker to warn")
    assert Approval.objects.get(pk=approval.pk).escalated_at is None  # turned off there
    (note,) = Notification.objects.filter(approval_id=approval.pk, event="approval.expiring")
    assert note.channel == "webhook" and note.target == "http://127.0.0.1:9/hook"
    assert len(events(run, "approval.warned")) == 1
    wait_until(lambda: "near their deadline: warned" in worker.output(), timeout=10,
               what="the worker's log line")
    assert f"warned [{approval.pk}]" in worker.output() and "Traceback" not in worker.output()
    assert verify(run.pk).ok


# -- who is told --------------------------------------------------------------------------------


def test_a_groups_members_are_read_when_the_message_is_written(database, tmp_path, clock,
                                                               configured):
    """The group's active members with an address, as they are at the escalation; a long list
    is split over messages that fit; a group with nobody to mail is on the record as failed."""
    configured.RUNTIME = {**configured.RUNTIME, "NOTIFY": [
        {"name": "leads", "kind": "email", "group": "leads", "target": "duty@example.com",
         "events": ["approval.escalated"]},
        {"name": "empty", "kind": "email", "group": "nobody-here",
         "events": ["approval.escalated"]}]}
    with registry.override(_agent("grp", Ledger(tmp_path / "ledger"), 60)):
        first = _paused("grp", clock)
        assert approvals_escalate(clock.now()) == [first.pk]
        leads = Group.objects.get(name="leads")
        for n in range(30):  # 30 more, about 600 characters of addresses
            User.objects.create_user(f"lead{n:02}", f"lead-number-{n:02}@example.com",
                                     "x" * 16).groups.add(leads)
        User.objects.filter(username="bob").update(is_active=False)
        second = _paused("grp", clock)
    assert approvals_escalate(clock.now()) == [second.pk]
    told = list(Notification.objects.filter(approval_id=second.pk, channel="leads")
                .exclude(event="approval.requested").order_by("pk"))
    assert len(told) == 2 and all(len(n.target) <= 500 for n in told)
    assert len({n.idempotency_key for n in told}) == 2
    addresses = [a for n in told for a in n.target.split(",")]
    assert addresses[0] == "duty@example.com" and len(addresses) == len(set(addresses)) == 32
    assert "ann@example.com" in addresses and "bob@example.com" not in addresses
    assert "old@example.com" not in addresses and "eve@example.com" not in addresses
    (earlier,) = Notification.objects.filter(approval_id=first.pk, channel="leads",
                                             event="approval.escalated")
    assert earlier.target == "duty@example.com,ann@example.com,bob@example.com"  # as it was then
    (empty,) = Notification.objects.filter(approval_id=second.pk, channel="empty")
    assert empty.status == "failed" and empty.target == ""
    assert "'nobody-here' has no active user with an email address" in empty.last_error


@pytest.mark.parametrize(("channel", "wrong"), [
    ({"kind": "webhook", "target": "https://h.example/x", "group": "leads"},
     "for email channels only"),
    ({"kind": "email", "group": "g" * 151}, "up to 150 characters"),
    ({"kind": "email"}, r"a target \(URL or addresses\) is needed"),
    ({"kind": "webhook", "target": "https://h.example/x", "events": ["approval.warned"]},
     "unknown events"),
])
def test_a_malformed_channel_is_refused(settings, channel, wrong):
    settings.RUNTIME = {**settings.RUNTIME, "NOTIFY": [channel]}
    with pytest.raises(ImproperlyConfigured, match=wrong):
        channels()


def test_the_default_events_include_the_warning_not_the_escalation(settings):
    settings.RUNTIME = {**settings.RUNTIME, "NOTIFY": [
        {"name": "a", "kind": "webhook", "target": "https://h.example/a"},
        {"name": "b", "kind": "email", "group": "leads", "events": ["approval.escalated"]}]}
    a, b = channels()
    assert a.events == {"approval.requested", "approval.expiring"}
    assert b.events == {"approval.escalated"} and b.group == "leads" and b.target == ""


# -- the settings -----------------------------------------------------------------------------


@pytest.mark.parametrize(("warn", "escalate", "wrong"), [
    (900, 900, "must be less than"),
    (300, 900, "must be less than"),
    (-1, 0, "APPROVAL_WARN_BEFORE'] must be a number of seconds"),
    (900, -5, "APPROVAL_ESCALATE_BEFORE'] must be a number of seconds"),
    ("900", 300, "must be a number of seconds"),
    (True, 0, "must be a number of seconds"),
    (float("nan"), 0, "must be a number of seconds"),
    (31 * 86400, 0, "must be a number of seconds"),
])
def test_points_that_do_not_fit_are_refused(database, tmp_path, clock, settings, warn, escalate,
                                            wrong):
    settings.RUNTIME = {**settings.RUNTIME, "APPROVAL_WARN_BEFORE": warn,
                        "APPROVAL_ESCALATE_BEFORE": escalate}
    problem = deadline_problem(settings.RUNTIME)
    assert problem is not None and wrong in problem
    assert any(wrong in p for p in runtime_problems(settings.RUNTIME))  # manage.py check
    with registry.override(_agent("bad", Ledger(tmp_path / "ledger"), 60)):
        approval = _paused("bad", clock)
    for point in (WARNING, ESCALATION):
        with pytest.raises(ImproperlyConfigured, match=wrong.split("'")[0]):
            deadline_seconds(point)
    with pytest.raises(ImproperlyConfigured):
        approvals_near_deadline(clock.now())
    assert Approval.objects.get(pk=approval.pk).warned_at is None  # nothing changed


@pytest.mark.parametrize(("warn", "escalate"), [(900, 300), (900, 0), (0, 300), (0, 0),
                                                (60.5, 0.5)])
def test_points_that_fit_are_accepted(warn, escalate):
    runtime = {"APPROVAL_WARN_BEFORE": warn, "APPROVAL_ESCALATE_BEFORE": escalate}
    assert deadline_problem(runtime) is None and runtime_problems(runtime) == []


def test_the_environment_variables(settings):
    assert value("RUNTIME_APPROVAL_WARN_BEFORE", {}) == 900.0
    assert value("RUNTIME_APPROVAL_ESCALATE_BEFORE", {}) == 300.0
    assert value("RUNTIME_APPROVAL_WARN_BEFORE", {"RUNTIME_APPROVAL_WARN_BEFORE": "0"}) == 0
    for bad in ("-1", "soon", "2592001"):
        with pytest.raises(ConfigError, match="RUNTIME_APPROVAL_ESCALATE_BEFORE must be"):
            value("RUNTIME_APPROVAL_ESCALATE_BEFORE", {"RUNTIME_APPROVAL_ESCALATE_BEFORE": bad})


@pytest.mark.parametrize("how", ["one", "batch"])
def test_a_warning_written_while_deciding_does_not_refuse_the_decision(database, tmp_path,
                                                                       configured, monkeypatch,
                                                                       how):
    """The warning moves the waiting run's chain between the decision's plan and its commit:
    the decision is planned again on the new head and lands, after the warning, once."""
    from runtime.approvals import batch, decisions

    clock = ManualClock()
    with registry.override(_agent("mid", Ledger(tmp_path / "ledger"), HOUR)):
        approval = _paused("mid", clock)
    at = approval.expires_at - timedelta(seconds=600)
    module = decisions if how == "one" else batch
    planned, original = [], module.decision_plan

    def plan_then_warn(*args, **kwargs):
        plan = original(*args, **kwargs)
        if not planned:  # the first plan only: it is stale by the time it commits
            assert approvals_warn(at) == [approval.pk]
        planned.append(plan)
        return plan

    monkeypatch.setattr(module, "decision_plan", plan_then_warn)
    if how == "one":
        approve(approval.pk, by="alice", now=at)
    else:
        batch.approvals_decide([(approval.pk, approval.digest)], "approve", "alice", now=at)
    assert len(planned) >= 2  # planned again after the warning
    kinds = events_of(approval.run_id)
    assert kinds.count("approval.warned") == 1 and kinds.count("approval.granted") == 1
    assert kinds.index("approval.warned") < kinds.index("approval.granted")
    assert Approval.objects.get(pk=approval.pk).status == "approved"
    verifyaudit()
