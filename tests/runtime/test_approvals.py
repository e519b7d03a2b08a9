"""Design §8: operators' decisions on approvals — approve one re-run, reject, resolve — and the
approval queue. Side-effect counts come from the Ledger, never from the runtime's tables."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runtime import (
    Agent,
    Allow,
    FinalAnswer,
    RequireApproval,
    ScriptedLLM,
    ToolCall,
    resume,
    start,
)
from runtime.agents.agent import registry
from runtime.approvals.decisions import approve, reject, resolve
from runtime.audit.chain import verify
from runtime.canonical import request_digest
from runtime.clock import ManualClock
from runtime.crashpoints import CrashPoint
from runtime.errors import ApprovalConflict, InvalidDecision, RunNotResumable
from runtime.models import Approval, Event, Run, Step
from runtime.selectors.approvals import pending
from tests.kit import (
    Ledger,
    crash_then_take_over,
    events,
    events_of,
    kinds_after,
    make_agent,
    make_tools,
    snapshot,
)

pytestmark = pytest.mark.engines


@pytest.fixture
def interrupted(database, tmp_path, clock, crash):
    """A run whose `charge` (step 1) went out and was interrupted before its result was
    recorded: it waits on an interrupted_side_effect approval. Yields (run, approval, ledger)."""
    ledger = Ledger(tmp_path / "ledger")
    agent = make_agent("ap", [ToolCall("charge", {"amount": 5}), FinalAnswer("done")], ledger)
    with registry.override(agent):
        run = start("ap", {}, clock=clock)
        run = crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_TOOL_EFFECT, 1)
        assert run.status == "waiting"
        assert ledger.count("charge") == 1
        (approval,) = pending()
        assert approval.kind == "interrupted_side_effect"
        yield run, approval, ledger


def _policy_paused(agent_name: str, ledger: Ledger, clock) -> tuple[Run, Approval]:
    """A run paused by its policy before `charge` starts (a policy approval)."""
    run = start(agent_name, {}, clock=clock)
    run = resume(run.pk, clock=clock, lease_seconds=1)
    assert run.status == "waiting"
    return run, Approval.objects.get(run_id=run.pk, status="pending")


def _policy_agent(name: str, ledger: Ledger) -> Agent:
    def policy(request, run):
        return RequireApproval("Charge a card?", f"{request.arguments}") \
            if request.tool == "charge" else Allow()

    return Agent(name, ScriptedLLM([ToolCall("charge", {"amount": 9}), FinalAnswer("done")]),
                 make_tools(ledger), policy=policy)


# -- approve / reject / resolve ------------------------------------------------------------------


def test_approve_runs_the_same_request_once_on_the_same_step(interrupted, clock):
    run, approval, ledger = interrupted
    key = Step.objects.get(run_id=run.pk, index=1).idempotency_key
    decided = approve(approval.pk, by="alice", note="no charge found for the key",
                      now=clock.now())
    assert decided.status == "approved" and decided.decided_by == "alice"
    assert decided.decided_at == clock.now() and decided.consumed_at is None
    assert Run.objects.get(pk=run.pk).status == "queued"
    granted = events(run, "approval.granted")[0]
    assert granted.actor == "alice"
    assert granted.payload["approval_id"] == approval.pk
    assert granted.payload["note"] == "no charge found for the key"
    assert ledger.count("charge") == 1  # a decision alone runs nothing

    with registry.override(make_agent("ap", [ToolCall("charge", {"amount": 5}),
                                             FinalAnswer("done")], ledger)):
        run = resume(run.pk, owner="worker-c", clock=clock, lease_seconds=1)
        assert run.status == "succeeded" and run.output == "done"
        with pytest.raises(RunNotResumable):
            resume(run.pk, owner="worker-d", clock=clock, lease_seconds=1)

    calls = ledger.calls("charge")
    assert len(calls) == 2  # 1 + the one approval consumed
    assert [(c["amount"], c["key"], c["attempt"]) for c in calls] == [(5, key, 1), (5, key, 2)]
    steps = list(Step.objects.filter(run_id=run.pk).order_by("index"))
    assert [(s.index, s.tool, s.status) for s in steps] == [
        (1, "charge", "succeeded"), (2, "", "succeeded")]  # the same step, no new one
    assert steps[0].attempt == 2 and steps[0].result == {"charged": 5}
    a = Approval.objects.get(pk=approval.pk)
    assert a.status == "consumed" and a.consumed_at is not None
    assert kinds_after(run, "approval.granted")[:5] == [
        "lease.taken", "run.resumed", "approval.consumed", "step.tool_started",
        "step.tool_finished"]
    consumed = events(run, "approval.consumed")
    assert len(consumed) == 1 and consumed[0].payload["approval_id"] == approval.pk
    started = events(run, "step.tool_started")
    assert [(e.step_index, e.payload["attempt"]) for e in started] == [(1, 1), (1, 2)]
    assert started[-1].seq == consumed[0].seq + 1  # consumed in the start's own commit
    assert verify(run.pk).ok


@pytest.mark.parametrize("kind", ["interrupted_side_effect", "policy"])
def test_reject_ends_the_run_without_calling_the_tool(database, tmp_path, clock, crash, kind):
    ledger = Ledger(tmp_path / "ledger")
    if kind == "policy":
        agent = _policy_agent("rj", ledger)
        with registry.override(agent):
            run, approval = _policy_paused("rj", ledger, clock)
        before = 0
    else:
        agent = make_agent("rj", [ToolCall("charge", {"amount": 5}), FinalAnswer("done")], ledger)
        with registry.override(agent):
            run = start("rj", {}, clock=clock)
            crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_TOOL_EFFECT, 1)
        approval = Approval.objects.get(run_id=run.pk)
        before = 1
    assert approval.kind == kind
    assert ledger.count("charge") == before

    decided = reject(approval.pk, by="bob", note="charged already; refunding by hand")
    assert decided.status == "rejected" and decided.decided_by == "bob"
    run = Run.objects.get(pk=run.pk)
    assert run.status == "failed" and run.failure_code == "rejected"
    assert "bob" in run.failure_message and "refunding by hand" in run.failure_message
    assert Step.objects.get(run_id=run.pk, index=1).status == "rejected"
    assert kinds_after(run, "run.paused")[-2:] == ["approval.rejected", "run.failed"]
    rejected = events(run, "approval.rejected")[0]
    assert rejected.actor == "bob"
    assert rejected.payload["note"] == "charged already; refunding by hand"
    assert events(run, "run.failed")[0].payload["code"] == "rejected"

    with registry.override(agent), pytest.raises(RunNotResumable):
        resume(run.pk, owner="worker-c", clock=clock, lease_seconds=1)
    with pytest.raises(ApprovalConflict):
        approve(approval.pk, by="carol")
    assert ledger.count("charge") == before  # never called again
    assert len(events(run, "step.tool_started")) == before
    assert verify(run.pk).ok


def test_resolve_records_the_recovered_result_and_continues(interrupted, clock):
    run, approval, ledger = interrupted
    found = {"charged": 5, "receipt": "r-123"}
    decided = resolve(approval.pk, by="carol", result=found, note="found it in the dashboard",
                      now=clock.now())
    assert decided.status == "resolved" and decided.result == found
    s = Step.objects.get(run_id=run.pk, index=1)
    assert s.status == "succeeded" and s.result == found
    assert Run.objects.get(pk=run.pk).status == "queued"
    assert kinds_after(run, "run.paused")[-2:] == ["approval.resolved", "step.tool_finished"]
    finished = events(run, "step.tool_finished")[0]
    assert finished.actor == "carol"
    assert finished.payload == {"result": found, "attempt": 1, "recovered_by": "carol"}
    assert events(run, "approval.resolved")[0].payload["result"] == found

    seen = []

    def script(transcript):
        seen.append([(e.tool, e.result) for e in transcript.entries])
        return FinalAnswer({"receipt": transcript.entries[0].result["receipt"]})

    agent = Agent("ap", ScriptedLLM(script), make_tools(ledger))
    with registry.override(agent):
        run = resume(run.pk, owner="worker-c", clock=clock, lease_seconds=1)
    assert run.status == "succeeded" and run.output == {"receipt": "r-123"}
    assert seen == [[("charge", found)]]  # the LLM was told the operator's result
    assert ledger.count("charge") == 1  # the tool was not called again
    assert len(events(run, "step.tool_started")) == 1
    assert Approval.objects.get(pk=approval.pk).status == "resolved"
    assert "approval.consumed" not in events_of(run)
    assert verify(run.pk).ok


@pytest.mark.parametrize("point", [CrashPoint.AFTER_TOOL_STARTED, CrashPoint.AFTER_TOOL_EFFECT])
def test_second_crash_after_approval_waits_again(interrupted, clock, crash, point):
    run, first, ledger = interrupted
    agent = make_agent("ap", [ToolCall("charge", {"amount": 5}), FinalAnswer("done")], ledger)
    approve(first.pk, by="alice")
    went_out = 2 if point == CrashPoint.AFTER_TOOL_EFFECT else 1
    with registry.override(agent):
        # The approved re-run starts (consuming the approval), and the process dies again
        # before its outcome is recorded.
        run = crash_then_take_over(run.pk, clock, crash, point, 1,
                                   dead="worker-c", heir="worker-d")
        assert ledger.count("charge") == went_out
        assert run.status == "waiting"
        first = Approval.objects.get(pk=first.pk)
        assert first.status == "consumed" and first.consumed_at is not None
        (second,) = pending()
        assert second.pk != first.pk and second.step_id == first.step_id
        assert second.kind == "interrupted_side_effect"
        assert second.digest == first.digest
        assert "attempt 2" in second.detail and "worker-c" in second.detail
        assert events_of(run).count("approval.consumed") == 1
        assert kinds_after(run, "step.interrupted") == [
            "approval.requested", "run.paused", "lease.released"]
        with pytest.raises(ApprovalConflict):  # the consumed approval authorizes nothing more
            approve(first.pk, by="alice")
        with pytest.raises(RunNotResumable):
            resume(run.pk, owner="worker-e", clock=clock, lease_seconds=1)
        assert ledger.count("charge") == went_out  # never a silent re-run

        approve(second.pk, by="alice")
        run = resume(run.pk, owner="worker-e", clock=clock, lease_seconds=1)
    assert run.status == "succeeded"
    consumed = Approval.objects.filter(run_id=run.pk, status="consumed").count()
    assert consumed == 2
    assert ledger.count("charge") <= 1 + consumed  # invariant 1, counted by the outside world
    assert ledger.count("charge") == went_out + 1
    assert [c["attempt"] for c in ledger.calls("charge")][-1] == 3
    assert [e.payload["attempt"] for e in events(run, "step.tool_started")] == [1, 2, 3]
    assert verify(run.pk).ok


def test_a_start_that_never_committed_does_not_consume_the_approval(interrupted, clock, crash):
    """A crash inside the start's transaction rolls the consumption back with it."""
    run, approval, ledger = interrupted
    agent = make_agent("ap", [ToolCall("charge", {"amount": 5}), FinalAnswer("done")], ledger)
    approve(approval.pk, by="alice")
    with registry.override(agent):
        run = crash_then_take_over(run.pk, clock, crash, CrashPoint.IN_TRANSACTION, 1,
                                   dead="worker-c", heir="worker-d")
    assert run.status == "succeeded"
    assert Approval.objects.get(pk=approval.pk).status == "consumed"
    assert events_of(run).count("approval.consumed") == 1
    assert [c["attempt"] for c in ledger.calls("charge")] == [1, 2]
    assert verify(run.pk).ok


def test_two_decisions_on_one_approval_one_wins(database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    agent = _policy_agent("race", ledger)
    with registry.override(agent):
        paused = [_policy_paused("race", ledger, clock) for _ in range(20)]

    for round_no, (run, approval) in enumerate(paused):
        n = 2 + round_no % 3  # 2, 3 or 4 operators at once
        barrier = threading.Barrier(n)
        outcomes: dict[int, tuple[str, object]] = {}

        def decide(j: int, pk: int = approval.pk, barrier: threading.Barrier = barrier,
                   outcomes: dict = outcomes, round_no: int = round_no) -> None:
            try:
                barrier.wait(timeout=10)
                if (j + round_no) % 2 == 0:
                    outcomes[j] = ("won", approve(pk, by=f"op{j}", note="go"))
                else:
                    outcomes[j] = ("won", reject(pk, by=f"op{j}", note=f"no, says op{j}"))
            except ApprovalConflict as exc:
                outcomes[j] = ("lost", exc)
            except BaseException as exc:
                outcomes[j] = ("error", exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=decide, args=(j,)) for j in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        assert len(outcomes) == n
        assert [o for o in outcomes.values() if o[0] == "error"] == []
        winners = [o[1] for o in outcomes.values() if o[0] == "won"]
        losers = [o[1] for o in outcomes.values() if o[0] == "lost"]
        assert len(winners) == 1 and len(losers) == n - 1
        (won,) = winners
        when = won.decided_at.isoformat(timespec="seconds")
        for conflict in losers:
            assert conflict.approval_id == approval.pk
            assert conflict.decided_by == won.decided_by
            assert conflict.decided_at == won.decided_at
            assert conflict.status == won.status
            assert f"already {won.status} by {won.decided_by} at {when}" in str(conflict)

        stored = Approval.objects.get(pk=approval.pk)
        assert (stored.status, stored.decided_by) == (won.status, won.decided_by)
        run = Run.objects.get(pk=run.pk)
        decisions = [e for e in Event.objects.filter(run_id=run.pk).order_by("seq")
                     if e.kind in ("approval.granted", "approval.rejected")]
        assert len(decisions) == 1 and decisions[0].actor == won.decided_by
        if won.status == "approved":
            assert run.status == "queued" and decisions[0].kind == "approval.granted"
        else:
            assert run.status == "failed" and run.failure_code == "rejected"
            assert decisions[0].kind == "approval.rejected"
        assert verify(run).ok
    assert ledger.count("charge") == 0


def test_stale_approval_is_refused(interrupted, clock):
    run, approval, ledger = interrupted
    s = Step.objects.get(run_id=run.pk, index=1)
    with connection.cursor() as cur:  # the request changes behind the runtime's back
        cur.execute("UPDATE runtime_step SET arguments = %s WHERE id = %s",
                    ['{"amount": 500}', s.pk])
    before = snapshot(run.pk)
    with pytest.raises(ApprovalConflict) as err:
        approve(approval.pk, by="alice")
    assert "stale" in str(err.value)
    assert err.value.approval_id == approval.pk
    with pytest.raises(ApprovalConflict):
        resolve(approval.pk, by="alice", result={"charged": 500})
    assert snapshot(run.pk) == before  # nothing changed
    a = Approval.objects.get(pk=approval.pk)
    assert a.status == "pending" and a.decided_by == "" and a.decided_at is None
    assert Run.objects.get(pk=run.pk).status == "waiting"
    with pytest.raises(RunNotResumable):
        resume(run.pk, owner="worker-c", clock=clock, lease_seconds=1)
    assert ledger.count("charge") == 1
    assert verify(run.pk, replay=False).ok  # the refusal wrote nothing to the chain
    audit = verify(run.pk)  # and the audit names the edit made behind its back
    assert not audit.ok and "step 1: arguments is" in audit.reason


def _approved_then_altered(interrupted, clock) -> tuple[Run, Approval, Ledger, Approval]:
    run, approval, ledger = interrupted
    approve(approval.pk, by="alice")
    s = Step.objects.get(run_id=run.pk, index=1)
    with connection.cursor() as cur:
        cur.execute("UPDATE runtime_step SET arguments = %s WHERE id = %s",
                    ['{"amount": 500}', s.pk])
    agent = make_agent("ap", [ToolCall("charge", {"amount": 5}), FinalAnswer("done")], ledger)
    with registry.override(agent):
        run = resume(run.pk, owner="worker-c", clock=clock, lease_seconds=1)
    (fresh,) = pending()
    return run, approval, ledger, fresh


def test_an_approval_whose_own_request_was_changed_can_only_be_rejected(interrupted, clock):
    """The step still holds the real request (what runs, what the digest is checked against);
    only the approval's copy, which a page shows, was changed: a person would be deciding on
    one request while another ran."""
    run, approval, ledger = interrupted
    with connection.cursor() as cur:
        cur.execute("UPDATE runtime_approval SET arguments = %s WHERE id = %s",
                    ['{"amount": 0.01}', approval.pk])
    before = snapshot(run.pk)
    for decide in (lambda: approve(approval.pk, by="alice"),
                   lambda: resolve(approval.pk, by="alice", result={"charged": 5})):
        with pytest.raises(ApprovalConflict) as err:
            decide()
        assert "does not match its digest" in str(err.value)
    assert snapshot(run.pk) == before
    reject(approval.pk, by="alice", note="the approval was tampered with")
    assert Run.objects.get(pk=run.pk).status == "failed"
    assert ledger.count("charge") == 1


def test_stale_approval_is_refused_when_it_would_be_consumed(interrupted, clock):
    run, approval, ledger, fresh = _approved_then_altered(interrupted, clock)
    assert run.status == "waiting"
    assert ledger.count("charge") == 1  # the altered request did not run
    assert "step.tool_started" not in kinds_after(run, "approval.granted")
    assert "approval.consumed" not in events_of(run)
    old = Approval.objects.get(pk=approval.pk)
    assert old.status == "cancelled" and old.consumed_at is None
    cancelled = events(run, "approval.cancelled")[0].payload
    assert cancelled["approval_id"] == approval.pk and "stale" in cancelled["reason"]
    # a new question, bound to the request as it now stands
    assert fresh.pk != approval.pk and fresh.arguments == {"amount": 500}
    assert fresh.digest == request_digest("charge", {"amount": 500}, "side_effect")
    assert verify(run.pk, replay=False).ok
    audit = verify(run.pk)  # the edit behind the runtime's back stays on the record
    assert not audit.ok and "step 1: arguments is" in audit.reason


def test_stale_approval_reasked_shows_the_request_it_now_approves(interrupted, clock):
    _run, _approval, _ledger, fresh = _approved_then_altered(interrupted, clock)
    assert fresh.arguments == {"amount": 500}  # what the page shows as the request
    assert "whether it took effect is unknown" in fresh.detail
    assert '"amount": 5' not in fresh.detail  # the old request is not described


# -- refused decisions change nothing ------------------------------------------------------------


def test_reject_without_a_note_is_refused(interrupted):
    run, approval, ledger = interrupted
    before = snapshot(run.pk)
    for note in ("", "   "):
        with pytest.raises(InvalidDecision):
            reject(approval.pk, by="bob", note=note)
    with pytest.raises(InvalidDecision):
        approve(approval.pk, by="")  # a decision needs a name
    assert snapshot(run.pk) == before
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert ledger.count("charge") == 1


def test_resolve_of_a_policy_approval_is_refused(database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_policy_agent("rs", ledger)):
        run, approval = _policy_paused("rs", ledger, clock)
    assert approval.kind == "policy"
    before = snapshot(run.pk)
    with pytest.raises(InvalidDecision):
        resolve(approval.pk, by="carol", result={"charged": 9})
    assert snapshot(run.pk) == before
    assert Step.objects.get(run_id=run.pk, index=1).status == "waiting"
    assert ledger.count("charge") == 0


def test_resolve_with_a_result_that_is_not_json_is_refused(interrupted):
    run, approval, _ledger = interrupted
    before = snapshot(run.pk)
    with pytest.raises(InvalidDecision):
        resolve(approval.pk, by="carol", result={"at": object()})
    assert snapshot(run.pk) == before


def test_an_approvals_save_signal_sees_a_real_transaction_and_on_commit_waits(database, tmp_path,
                                                                          clock):
    """A project's post_save receiver on Approval may use on_commit(): it must run after the
    pause is committed (seen from another connection), never inside the transaction."""
    from django.db import transaction
    from django.db.models.signals import post_save

    from tests.kit import Background

    seen: list[tuple] = []

    def receiver(sender, instance, created, **kwargs):
        def after() -> None:
            status = Background(lambda: Run.objects.get(pk=instance.run_id).status).join()
            seen.append(("committed", status.result))
        seen.append(("saved", transaction.get_connection().in_atomic_block))
        transaction.on_commit(after)

    ledger = Ledger(tmp_path / "ledger")
    post_save.connect(receiver, sender=Approval)
    try:
        with registry.override(_policy_agent("sig", ledger)):
            _policy_paused("sig", ledger, clock)
    finally:
        post_save.disconnect(receiver, sender=Approval)
    assert seen == [("saved", True), ("committed", "waiting")]


# -- the queue -----------------------------------------------------------------------------------


def test_pending_lists_oldest_first(database, tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    t0 = ManualClock().now()
    made = []
    with registry.override(_policy_agent("q1", ledger), _policy_agent("q2", ledger)):
        # created in this order (ascending pk), but paused at these times
        for name, offset in (("q1", 100), ("q2", 0), ("q1", 50), ("q2", 75)):
            _, approval = _policy_paused(name, ledger, ManualClock(t0 + timedelta(seconds=offset)))
            made.append(approval.pk)
    assert made == sorted(made)
    by_time = [made[1], made[2], made[3], made[0]]
    assert [a.pk for a in pending()] == by_time
    assert [a.pk for a in pending(agent="q1")] == [made[2], made[0]]
    assert [a.pk for a in pending(kind="policy")] == by_time
    assert list(pending(kind="interrupted_side_effect")) == []
    approve(made[2], by="alice")
    reject(made[3], by="bob", note="no")
    assert [a.pk for a in pending()] == [made[1], made[0]]


def test_pending_has_no_n_plus_1(database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_policy_agent("np", ledger)):
        for _ in range(6):
            _policy_paused("np", ledger, clock)
    with CaptureQueriesContext(connection) as queries:
        rows = [(a.pk, a.run.agent, a.run.status, a.step.index, a.step.tool, a.step.run_id)
                for a in pending()]
    assert len(rows) == 6
    assert all(r[1:5] == ("np", "waiting", 1, "charge") for r in rows)
    assert len(queries.captured_queries) == 1, [q["sql"] for q in queries.captured_queries]
