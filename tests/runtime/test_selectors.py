"""The reads pages make, with the runtime's rules applied once: whether a worker or a lease is
live (judged in SQL, the same on both engines), which decisions a person may make, and the
bounded tails of long runs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runtime import selectors
from runtime.canonical import request_digest
from runtime.loop.control import start
from runtime.models import Approval, Event, Run, Step, Worker


@pytest.mark.engines
def test_a_worker_is_live_while_its_heartbeat_is_younger_than_its_own_lease(database):
    """The rule is SQL (duration arithmetic differs between SQLite and PostgreSQL): each
    worker judged against its own lease, at one fixed moment."""
    now = timezone.now()
    cases = {"fresh": (3, 30, True), "lapsed": (45, 30, False), "a hair past": (30.5, 30, False),
             "long lease": (5000, 7200, True), "short lease": (0.2, 0.7, True)}
    for owner, (age, lease, _live) in cases.items():
        Worker.objects.create(owner=owner, host="h", pid=1, lease_seconds=lease,
                              started_at=now, heartbeat_at=now - timedelta(seconds=age))
    live = set(Worker.objects.filter(selectors.worker_live(now)).values_list("owner",
                                                                             flat=True))
    assert live == {owner for owner, (_a, _l, is_live) in cases.items() if is_live}
    assert selectors.live_workers(now) == sorted(live)


@pytest.mark.engines
def test_a_lease_is_live_by_the_databases_clock(database):
    run = start("hello", {"name": "n"})
    assert not selectors.run_lease_live(selectors.run_for_page(run.pk))  # nobody holds it
    Run.objects.filter(pk=run.pk).update(status="running", lease_owner="w",
                                         lease_expires_at=timezone.now() + timedelta(hours=1))
    assert selectors.run_lease_live(selectors.run_for_page(run.pk))
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert not selectors.run_lease_live(selectors.run_for_page(run.pk))
    assert selectors.run_for_page(run.pk + 1000) is None


def test_decisions_follow_the_kind_the_status_and_four_eyes(sqlite_path, settings):
    run = start("hello", {"name": "n"}, created_by="olga")
    step = Step.objects.create(run=run, index=1, status="interrupted", tool="send",
                               effect="side_effect", idempotency_key="k", attempt=1,
                               started_at=timezone.now())
    approval = Approval(run=run, step=step, kind="interrupted_side_effect", tool="send",
                        arguments={}, effect="side_effect",
                        digest=request_digest("send", {}, "side_effect"), title="t",
                        created_at=timezone.now())
    assert selectors.approval_decisions(approval, "pat") == ["approve", "resolve", "reject"]
    assert selectors.approval_outcome_unknown(approval)
    approval.kind = "policy"
    assert selectors.approval_decisions(approval, "pat") == ["approve", "reject"]
    assert not selectors.approval_outcome_unknown(approval)
    settings.RUNTIME = {**settings.RUNTIME, "FOUR_EYES": True}
    assert selectors.approval_decisions(approval, "olga") == ["reject"]  # she started it
    assert selectors.approval_decisions(approval, "pat") == ["approve", "reject"]
    approval.arguments = {"to": "someone else"}  # not what the digest names: reject only
    assert selectors.approval_decisions(approval, "pat") == ["reject"]
    approval.status = "approved"
    assert selectors.approval_decisions(approval, "pat") == []


def test_tails_of_a_long_run_are_bounded_and_say_how_to_reach_the_rest(sqlite_path):
    run = start("hello", {"name": "n"})
    now = timezone.now()
    Step.objects.bulk_create(Step(run=run, index=i, status="succeeded", tool="t",
                                  idempotency_key=f"k{i}", started_at=now)
                             for i in range(1, 121))
    tail = selectors.steps_tail(run.pk, limit=50)
    assert [s.index for s in tail.rows] == list(range(71, 121))
    assert (tail.total, tail.earlier) == (120, 71)
    assert [s.index for s in selectors.steps_tail(run.pk, upto=10, limit=50).rows] == list(
        range(1, 11))
    first = selectors.steps_tail(run.pk, before=21, limit=50)
    assert [s.index for s in first.rows] == list(range(1, 21)) and first.earlier is None
    events = selectors.events_tail(Run.objects.get(pk=run.pk), limit=2)
    seqs = list(Event.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert [e.seq for e in events.rows] == seqs[-2:] and events.total == seqs[-1]
