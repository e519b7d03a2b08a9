"""Design §8: approvals with a deadline. Past it with no decision the approval ends ``expired``
(``approval.expired``, never approved by default), the run fails ``approval_expired`` and the
tool is not called; a late decision is refused; expiry races a decision like a second person.
Side-effect counts come from the Ledger, never from the runtime's tables."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection

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
from runtime.approvals.decisions import approve, reject
from runtime.approvals.expiry import approvals_expire
from runtime.audit.chain import verify
from runtime.clock import ManualClock
from runtime.crashpoints import CrashPoint
from runtime.errors import ApprovalConflict, RunNotResumable
from runtime.models import Approval, Run, Step
from tests.kit import (
    Ledger,
    crash_then_take_over,
    events,
    events_of,
    kinds_after,
    make_tools,
    snapshot,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.engines


def _agent(name: str, ledger: Ledger, expires_in=60, *, ask_for: str = "charge") -> Agent:
    """Its policy asks a person before ``ask_for`` (with ``expires_in``); the LLM calls what the
    run's input names (``charge`` by default), then answers."""

    def policy(request, run):
        if request.tool == ask_for:
            return RequireApproval(f"Run {request.tool}?", f"{request.arguments}",
                                   expires_in=expires_in)
        return Allow()

    def script(transcript):
        if transcript.entries:
            return FinalAnswer("done")
        tool = (transcript.input or {}).get("tool", "charge")
        return ToolCall(tool, {"amount": 9} if tool == "charge" else {"to": "bob"})

    return Agent(name, ScriptedLLM(script), make_tools(ledger), policy=policy)


def _paused(agent_name: str, clock, input=None) -> tuple[Run, Approval]:
    run = start(agent_name, input or {}, clock=clock)
    run = resume(run.pk, clock=clock, lease_seconds=1)
    assert run.status == "waiting"
    return run, Approval.objects.get(run_id=run.pk, status="pending")


# -- a deadline passes -------------------------------------------------------------------------


@pytest.mark.parametrize("expires_in", [60, 60.0, timedelta(minutes=1)],
                         ids=["int", "float", "timedelta"])
def test_a_policy_approval_past_its_deadline_expires_and_the_run_fails(database, tmp_path, clock,
                                                                       expires_in):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_agent("exp", ledger, expires_in)):
        t0 = clock.now()
        run, approval = _paused("exp", clock)
        deadline = t0 + timedelta(seconds=60)
        assert approval.kind == "policy" and approval.expires_at == deadline
        requested = events(run, "approval.requested")[0].payload
        assert requested["expires_at"] == deadline.isoformat(timespec="microseconds")

        assert approvals_expire(deadline - timedelta(microseconds=1)) == []  # not yet
        assert Approval.objects.get(pk=approval.pk).status == "pending"
        assert Run.objects.get(pk=run.pk).status == "waiting"

        assert approvals_expire(deadline) == [approval.pk]  # the deadline itself is past it
        assert approvals_expire(deadline + timedelta(hours=1)) == []  # once

        a = Approval.objects.get(pk=approval.pk)
        assert a.status == "expired" and a.decided_at == deadline
        assert a.decided_by == "" and a.consumed_at is None
        run = Run.objects.get(pk=run.pk)
        assert run.status == "failed" and run.failure_code == "approval_expired"
        assert "charge" in run.failure_message and "deadline" in run.failure_message
        assert run.lease_owner == ""
        s = Step.objects.get(run_id=run.pk, index=1)
        assert s.status == "failed" and s.finished_at == deadline and s.attempt == 0
        assert kinds_after(run, "run.paused") == ["lease.released", "approval.expired",
                                                  "run.failed"]
        expired = events(run, "approval.expired")[0]
        assert expired.actor == "system" and expired.step_index == 1 and expired.at == deadline
        assert expired.payload["approval_id"] == approval.pk
        assert expired.payload["kind"] == "policy"
        assert expired.payload["expires_at"] == deadline.isoformat(timespec="microseconds")
        assert events(run, "run.failed")[0].payload["code"] == "approval_expired"

        # Never approved by default: nothing decides it, nothing runs it.
        with pytest.raises(ApprovalConflict) as err:
            approve(approval.pk, by="alice", now=deadline + timedelta(seconds=1))
        assert err.value.status == "expired"
        with pytest.raises(RunNotResumable):
            resume(run.pk, clock=clock, lease_seconds=1)
    assert ledger.count("charge") == 0
    assert "step.tool_started" not in events_of(run)
    assert verify(run.pk).ok


@pytest.mark.parametrize("expires_in", [0, -5, timedelta(0)])
def test_a_deadline_must_be_in_the_future(expires_in):
    with pytest.raises(ValueError, match="expires_in must be positive"):
        RequireApproval("Charge?", expires_in=expires_in)


def test_an_approval_without_a_deadline_never_expires(database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_agent("noexp", ledger, None)):
        run, approval = _paused("noexp", clock)
    assert approval.expires_at is None
    assert "expires_at" not in events(run, "approval.requested")[0].payload
    assert approvals_expire(clock.now() + timedelta(days=3650)) == []
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert ledger.count("charge") == 0


# -- a decision against the deadline -----------------------------------------------------------


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_decision_after_the_deadline_is_refused_even_before_the_sweep(database, tmp_path, clock,
                                                                        decision):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_agent("late", ledger, 60)):
        run, approval = _paused("late", clock)
    deadline = approval.expires_at
    before = snapshot(run.pk)
    for late in (deadline, deadline + timedelta(seconds=1), deadline + timedelta(days=1)):
        with pytest.raises(ApprovalConflict) as err:
            if decision == "approve":
                approve(approval.pk, by="alice", note="go", now=late)
            else:
                reject(approval.pk, by="alice", note="no", now=late)
        assert err.value.status == "expired"
        assert err.value.approval_id == approval.pk
        assert err.value.decided_at == deadline
        assert "expired" in str(err.value) and "too late" in str(err.value)
        assert snapshot(run.pk) == before  # nothing changed, not even the approval's status
    assert Approval.objects.get(pk=approval.pk).status == "pending"  # the sweep has not run

    assert approvals_expire(deadline + timedelta(seconds=2)) == [approval.pk]
    assert Approval.objects.get(pk=approval.pk).status == "expired"
    assert ledger.count("charge") == 0
    assert verify(run.pk).ok


def test_a_decision_just_before_the_deadline_wins_and_the_sweep_leaves_it(
        database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    agent = _agent("intime", ledger, 60)
    with registry.override(agent):
        run, approval = _paused("intime", clock)
        deadline = approval.expires_at
        decided = approve(approval.pk, by="alice", now=deadline - timedelta(microseconds=1))
        assert decided.status == "approved"
        assert approvals_expire(deadline + timedelta(hours=1)) == []
        assert Approval.objects.get(pk=approval.pk).status == "approved"
        clock.advance(3600)  # however late the run resumes, the approval was given in time
        run = resume(run.pk, clock=clock, lease_seconds=1)
    assert run.status == "succeeded"
    assert Approval.objects.get(pk=approval.pk).status == "consumed"
    assert "approval.expired" not in events_of(run)
    assert ledger.count("charge") == 1
    assert verify(run.pk).ok


def test_decision_and_expiry_racing_exactly_one_wins(database, tmp_path):
    """An operator deciding just in time and the sweep just after the deadline, started together
    at a barrier: one compare-and-set from ``pending`` wins, the other changes nothing."""
    ledger = Ledger(tmp_path / "ledger")
    clock = ManualClock()
    wins: list[str] = []
    with registry.override(_agent("race", ledger, 60)):
        for round_no in range(8):
            clock.advance(1000)
            run, approval = _paused("race", clock)
            deadline = approval.expires_at
            barrier = threading.Barrier(2)
            outcome: dict[str, object] = {}

            def decide(pk: int = approval.pk, barrier: threading.Barrier = barrier,
                       outcome: dict = outcome, round_no: int = round_no,
                       at=deadline - timedelta(seconds=1)) -> None:
                try:
                    barrier.wait(timeout=10)
                    if round_no % 2 == 0:
                        outcome["decision"] = approve(pk, by="alice", note="go", now=at)
                    else:
                        outcome["decision"] = reject(pk, by="alice", note="no", now=at)
                except BaseException as exc:  # ApprovalConflict is the expected loss
                    outcome["decision"] = exc
                finally:
                    connection.close()

            def sweep(barrier: threading.Barrier = barrier, outcome: dict = outcome,
                      at=deadline + timedelta(seconds=1)) -> None:
                try:
                    barrier.wait(timeout=10)
                    outcome["expiry"] = approvals_expire(at)
                except BaseException as exc:
                    outcome["expiry"] = exc
                finally:
                    connection.close()

            threads = [threading.Thread(target=decide), threading.Thread(target=sweep)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert not any(t.is_alive() for t in threads)
            decision, expiry = outcome["decision"], outcome["expiry"]
            assert isinstance(expiry, list), expiry
            stored = Approval.objects.get(pk=approval.pk)
            run = Run.objects.get(pk=run.pk)
            ends = [k for k in events_of(run)
                    if k in ("approval.granted", "approval.rejected", "approval.expired")]
            if isinstance(decision, Approval):  # the person won
                assert expiry == []
                assert stored.status == decision.status and stored.decided_by == "alice"
                assert len(ends) == 1 and ends[0] != "approval.expired"
                assert run.status == ("queued" if stored.status == "approved" else "failed")
                wins.append("decision")
            else:  # the sweep won; the person's decision changed nothing
                assert isinstance(decision, ApprovalConflict), decision
                assert decision.status == "expired"
                assert expiry == [approval.pk]
                assert stored.status == "expired" and stored.decided_by == ""
                assert ends == ["approval.expired"]
                assert run.status == "failed" and run.failure_code == "approval_expired"
                wins.append("expiry")
            assert verify(run.pk).ok
    assert len(wins) == 8
    assert ledger.count("charge") == 0  # nobody resumed: a decision alone runs nothing


# -- the per-agent default for approvals a policy did not ask for ------------------------------


def test_the_agent_default_deadline_applies_to_an_interrupted_side_effect_only(
        database, tmp_path, clock, crash, settings):
    settings.RUNTIME = {**settings.RUNTIME, "APPROVAL_EXPIRES_SECONDS": {"dflt": 30}}
    ledger = Ledger(tmp_path / "ledger")
    # Its policy asks about `send` with no deadline of its own; `charge` is allowed.
    dflt = _agent("dflt", ledger, None, ask_for="send")
    other = _agent("other", ledger, None, ask_for="send")  # not in the table
    with registry.override(dflt, other):
        # An interrupted charge of agent dflt: its approval gets the default deadline.
        run = start("dflt", {"tool": "charge"}, clock=clock)
        run = crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_TOOL_EFFECT, 1)
        paused_at = clock.now()
        interrupted = Approval.objects.get(run_id=run.pk)
        assert interrupted.kind == "interrupted_side_effect"
        assert interrupted.expires_at == paused_at + timedelta(seconds=30)
        assert ledger.count("charge") == 1

        # A policy approval of the same agent without expires_in: no deadline.
        policy_run, policy_approval = _paused("dflt", clock, {"tool": "send"})
        assert policy_approval.kind == "policy" and policy_approval.expires_at is None

        # An interrupted charge of another agent: no default for it.
        run_b = start("other", {"tool": "charge"}, clock=clock)
        run_b = crash_then_take_over(run_b.pk, clock, crash, CrashPoint.AFTER_TOOL_EFFECT, 1,
                                     dead="worker-c", heir="worker-d")
        other_approval = Approval.objects.get(run_id=run_b.pk)
        assert other_approval.kind == "interrupted_side_effect"
        assert other_approval.expires_at is None

    far = clock.now() + timedelta(days=365)
    assert approvals_expire(far) == [interrupted.pk]
    a = Approval.objects.get(pk=interrupted.pk)
    assert a.status == "expired"
    run = Run.objects.get(pk=run.pk)
    assert run.status == "failed" and run.failure_code == "approval_expired"
    # The step's outcome stays unknown: it is not "failed" (it may have charged), nor re-run.
    assert Step.objects.get(run_id=run.pk, index=1).status == "interrupted"
    assert kinds_after(run, "run.paused") == ["lease.released", "approval.expired",
                                              "run.failed"]
    for pending_one in (policy_approval, other_approval):
        assert Approval.objects.get(pk=pending_one.pk).status == "pending"
    assert ledger.count("charge") == 2  # one per interrupted run, never re-run
    assert ledger.count("send") == 0
    for r in (run.pk, policy_run.pk, run_b.pk):
        assert verify(r).ok


def test_a_wildcard_default_and_a_policys_own_deadline(database, tmp_path, clock, crash, settings):
    settings.RUNTIME = {**settings.RUNTIME, "APPROVAL_EXPIRES_SECONDS": {"*": 45, "own": 30}}
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_agent("any", ledger, None, ask_for="send"),
                           _agent("own", ledger, 10, ask_for="send")):
        run = start("any", {"tool": "charge"}, clock=clock)
        crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_TOOL_EFFECT, 1)
        assert Approval.objects.get(run_id=run.pk).expires_at == clock.now() + timedelta(
            seconds=45)
        _, mine = _paused("own", clock, {"tool": "send"})
        assert mine.expires_at == clock.now() + timedelta(seconds=10)  # the policy's own wins


# -- a worker does it on its own -----------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_process_expires_an_approval_on_its_own(database, tmp_path, spawn):
    ledger = Ledger(tmp_path / "ledger")
    with registry.override(_agent("wexp", ledger, 1.5)):
        run = start("wexp", {})  # the system clock: the worker judges the deadline by it
        run = resume(run.pk, lease_seconds=5)
    approval = Approval.objects.get(run_id=run.pk)
    assert approval.status == "pending" and approval.expires_at is not None
    worker = spawn("--poll-interval", "0.2")
    wait_until(lambda: Approval.objects.get(pk=approval.pk).status != "pending", timeout=30,
               what="the worker to expire the approval")
    a = Approval.objects.get(pk=approval.pk)
    assert a.status == "expired"
    assert a.decided_at >= a.expires_at  # not one moment early
    run = Run.objects.get(pk=run.pk)
    assert run.status == "failed" and run.failure_code == "approval_expired"
    expired = events(run, "approval.expired")
    assert len(expired) == 1 and expired[0].actor == "system"
    wait_until(lambda: "approval(s) expired" in worker.output(), timeout=10,
               what="the worker's log line")
    assert f"[{approval.pk}]" in worker.output()
    assert "Traceback" not in worker.output()
    assert ledger.count("charge") == 0
    assert verify(run.pk).ok
