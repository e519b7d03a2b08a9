"""Deciding many approvals at once (runtime.approvals.batch): every approval of a batch is
decided on the request shown, in one commit, or none is and the refusal names which. Tested
on both engines, including a batch racing single decisions and another batch."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection

from runtime import Agent, Allow, FinalAnswer, RequireApproval, ScriptedLLM, ToolCall, resume, start
from runtime.agents.agent import registry
from runtime.approvals.batch import BATCH_LIMIT, approvals_decide
from runtime.approvals.decisions import approve, reject
from runtime.audit.chain import verify
from runtime.crashpoints import CrashPoint
from runtime.errors import ApprovalConflict, BatchRefused, FourEyesViolation, InvalidDecision
from runtime.models import Approval, Event, Run
from tests.kit import Ledger, crash_then_take_over, make_agent, make_tools, snapshot

pytestmark = pytest.mark.engines

DECISION_EVENTS = ("approval.granted", "approval.rejected")


def _policy_agent(ledger: Ledger) -> Agent:
    def policy(request, run):
        return RequireApproval("Charge a card?", "over the limit") \
            if request.tool == "charge" else Allow()

    return Agent("batcher", ScriptedLLM([ToolCall("charge", {"amount": 9}), FinalAnswer("ok")]),
                 make_tools(ledger), policy=policy)


@pytest.fixture
def paused(database, tmp_path, clock):
    """Make runs paused by their policy before ``charge`` (each waits on a policy approval)."""
    ledger = Ledger(tmp_path / "ledger")

    def make(n: int, created_by: str = "") -> list[Approval]:
        out = []
        for _ in range(n):
            run = resume(start("batcher", {}, created_by=created_by, clock=clock).pk,
                         clock=clock, lease_seconds=1)
            assert run.status == "waiting"
            out.append(Approval.objects.get(run_id=run.pk, status="pending"))
        return out

    with registry.override(_policy_agent(ledger)):
        make.ledger = ledger  # type: ignore[attr-defined]
        yield make


def _items(approvals: list[Approval]) -> list[tuple[int, str]]:
    return [(a.pk, a.digest) for a in approvals]


def _decisions(run_id: int) -> list[Event]:
    return list(Event.objects.filter(run_id=run_id, kind__in=DECISION_EVENTS).order_by("seq"))


def _snapshots(approvals: list[Approval]) -> list[tuple]:
    return [snapshot(a.run_id) for a in approvals]


def test_a_batch_allows_every_approval_in_one_go(paused):
    approvals = paused(3)
    decided = approvals_decide(_items(approvals), "approve", "olga", "all fine")
    assert [a.pk for a in decided] == [a.pk for a in approvals]
    for a in decided:
        assert (a.status, a.decided_by, a.note) == ("approved", "olga", "all fine")
        run = Run.objects.get(pk=a.run_id)
        assert run.status == "queued"
        (event,) = _decisions(a.run_id)
        assert (event.kind, event.actor, event.payload["approval_id"]) == (
            "approval.granted", "olga", a.pk)
        assert verify(run).ok
    assert paused.ledger.count("charge") == 0  # allowed, not yet run


def test_a_batch_ends_every_run_with_the_note(paused):
    approvals = paused(2)
    approvals_decide(_items(approvals), "reject", "olga", "not today")
    for a in approvals:
        run = Run.objects.get(pk=a.run_id)
        assert (run.status, run.failure_code) == ("failed", "rejected")
        assert "not today" in run.failure_message
        assert [e.kind for e in _decisions(a.run_id)] == ["approval.rejected"]
        assert verify(run).ok


def test_one_decided_before_refuses_the_whole_batch_and_names_it(paused):
    first, second, third = paused(3)
    approve(second.pk, "bob")
    before = _snapshots([first, second, third])
    with pytest.raises(BatchRefused) as info:
        approvals_decide(_items([first, second, third]), "approve", "olga")
    assert set(info.value.refusals) == {second.pk}
    conflict = info.value.refusals[second.pk]
    assert isinstance(conflict, ApprovalConflict) and conflict.decided_by == "bob"
    assert "already approved by bob" in str(conflict)
    assert _snapshots([first, second, third]) == before  # nothing of the batch landed


def test_a_stale_digest_refuses_the_batch(paused):
    first, second = paused(2)
    before = _snapshots([first, second])
    with pytest.raises(BatchRefused) as info:
        approvals_decide([(first.pk, first.digest), (second.pk, "0" * 64)], "approve", "olga")
    (pk, conflict), = info.value.refusals.items()
    assert pk == second.pk and isinstance(conflict, ApprovalConflict)
    assert conflict.reason_code == "stale"
    assert _snapshots([first, second]) == before


def test_four_eyes_is_judged_per_item(paused, settings):
    settings.RUNTIME = {**settings.RUNTIME, "FOUR_EYES": True}
    (own,) = paused(1, created_by="ann")
    (other,) = paused(1, created_by="bob")
    before = _snapshots([own, other])
    with pytest.raises(BatchRefused) as info:
        approvals_decide(_items([own, other]), "approve", "ann")
    assert list(info.value.refusals) == [own.pk]
    assert isinstance(info.value.refusals[own.pk], FourEyesViolation)
    assert _snapshots([own, other]) == before
    # bob may allow both; ann may end both (stopping a run is open to everyone)
    approvals_decide(_items([other]), "approve", "ann")
    approvals_decide(_items([own]), "reject", "ann", "mine, and wrong")
    assert Approval.objects.get(pk=own.pk).status == "rejected"
    assert Approval.objects.get(pk=other.pk).status == "approved"


def test_an_expired_item_refuses_the_batch(database, tmp_path, clock, crash, settings):
    settings.RUNTIME = {**settings.RUNTIME, "APPROVAL_EXPIRES_SECONDS": {"*": 60}}
    ledger = Ledger(tmp_path / "ledger")
    agent = make_agent("exp", [ToolCall("charge", {"amount": 5}), FinalAnswer("done")], ledger)
    with registry.override(agent):
        run = start("exp", {}, clock=clock)
        crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_TOOL_EFFECT, 1)
    approval = Approval.objects.get(run_id=run.pk, status="pending")
    assert approval.expires_at is not None
    before = snapshot(run.pk)
    with pytest.raises(BatchRefused) as info:
        approvals_decide(_items([approval]), "approve", "olga",
                         now=approval.expires_at + timedelta(seconds=1))
    assert info.value.refusals[approval.pk].reason_code == "expired"  # type: ignore[attr-defined]
    assert snapshot(run.pk) == before
    assert ledger.count("charge") == 1


@pytest.mark.parametrize(("items", "decision", "note", "says"), [
    ([], "approve", "", "at least one approval"),
    ("many", "approve", "", f"at most {BATCH_LIMIT}"),
    ("one", "resolve", "", "one approval at a time"),
    ("one", "reject", "", "needs a note"),
    ("one", "nonsense", "", "unknown decision"),
])
def test_bad_batches_are_refused_whole(paused, items, decision, note, says):
    (approval,) = paused(1)
    if items == "one":
        items = _items([approval])
    elif items == "many":
        items = [(approval.pk + i, approval.digest) for i in range(BATCH_LIMIT + 1)]
    before = snapshot(approval.run_id)
    with pytest.raises(BatchRefused) as info:
        approvals_decide(items, decision, "olga", note)
    assert says in str(info.value) and info.value.refusals == {}
    assert snapshot(approval.run_id) == before


def test_duplicates_unknown_ids_and_missing_digests_are_named(paused):
    first, second = paused(2)
    before = _snapshots([first, second])
    with pytest.raises(BatchRefused) as info:
        approvals_decide([(first.pk, first.digest), (first.pk, first.digest),
                          (second.pk, "")], "approve", "olga")
    assert set(info.value.refusals) == {first.pk, second.pk}
    assert "twice" in str(info.value.refusals[first.pk])
    with pytest.raises(BatchRefused) as info:
        approvals_decide([(first.pk, first.digest), (999_999, "a" * 64)], "approve", "olga")
    assert list(info.value.refusals) == [999_999]
    assert isinstance(info.value.refusals[999_999], InvalidDecision)
    assert _snapshots([first, second]) == before


def _race(*jobs) -> list[tuple[str, object]]:
    """Run each job on its own thread, released together; each job's outcome."""
    barrier = threading.Barrier(len(jobs))
    outcomes: list[tuple[str, object]] = [("none", None)] * len(jobs)

    def go(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            outcomes[i] = ("won", jobs[i]())
        except (BatchRefused, ApprovalConflict) as exc:
            outcomes[i] = ("lost", exc)
        except BaseException as exc:  # a deadlock or a lock timeout would land here
            outcomes[i] = ("error", exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert [o for o in outcomes if o[0] in ("error", "none")] == []
    return outcomes


def test_a_batch_racing_a_single_decision_lands_whole_or_not_at_all(paused):
    rounds = 8
    approvals = paused(3 * rounds)
    seen = set()
    for r in range(rounds):
        batch = approvals[3 * r: 3 * r + 3]
        target = batch[r % 3]  # the one a second person decides alone

        def single(target=target, r=r):
            return (reject(target.pk, "bob", "no") if r % 2 else approve(target.pk, "bob"))

        batch_out, single_out = _race(lambda batch=batch: approvals_decide(
            _items(batch), "approve", "olga"), single)
        seen.add((batch_out[0], single_out[0]))
        # from the audit: the single decision landed once, or the batch did, never both
        by_run = {a.pk: _decisions(a.run_id) for a in batch}
        assert all(len(events) == 1 for events in by_run.values() if events)
        target_events = by_run[target.pk]
        assert len(target_events) == 1
        others = [by_run[a.pk] for a in batch if a.pk != target.pk]
        if batch_out[0] == "won":
            assert single_out[0] == "lost" and target_events[0].actor == "olga"
            assert all(e and e[0].actor == "olga" for e in others)
        else:
            assert single_out[0] == "won" and target_events[0].actor == "bob"
            assert all(e == [] for e in others)  # none of the batch landed
            refusal = batch_out[1]
            assert isinstance(refusal, BatchRefused) and target.pk in refusal.refusals
            assert Approval.objects.filter(pk__in=[a.pk for a in batch],
                                           status="pending").count() == 2
        for a in batch:
            assert verify(a.run_id).ok
    assert seen  # which side won is the race's; each round's outcome was whole


def test_two_batches_in_opposite_orders_never_deadlock_and_one_wins(paused):
    for _ in range(5):
        batch = paused(3)
        backwards = list(reversed(batch))
        first, second = _race(
            lambda batch=batch: approvals_decide(_items(batch), "approve", "olga"),
            lambda backwards=backwards: approvals_decide(_items(backwards), "reject", "bob", "no"))
        assert sorted([first[0], second[0]]) == ["lost", "won"]
        winner = "olga" if first[0] == "won" else "bob"
        for a in batch:
            (event,) = _decisions(a.run_id)
            assert event.actor == winner
