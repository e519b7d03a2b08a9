"""Design §7, the interruption contract: what a run does after a takeover.

A crash is simulated in-process: an armed crash point raises ``SimulatedCrash`` right after the
named commit, the dead owner keeps its lease until the ManualClock moves past it, then another
owner takes the run over. Side-effect counts come from the Ledger (the outside world's record).
"""

from __future__ import annotations

import json

import pytest

from runtime import (
    Agent,
    Complete,
    Conflict,
    Continue,
    FinalAnswer,
    ScriptedLLM,
    ToolCall,
    ToolContext,
    Wait,
    crashpoints,
    resume,
    start,
    tool,
)
from runtime.agents.agent import registry
from runtime.approvals.decisions import approve
from runtime.audit.chain import verify
from runtime.canonical import request_digest
from runtime.crashpoints import CrashPoint
from runtime.errors import LeaseLost, RunNotResumable, SimulatedCrash
from runtime.leasing.heartbeat import LeaseKeeper
from runtime.models import Approval, Event, Run, Step
from runtime.selectors.approvals import pending
from tests.kit import (
    Background,
    Gate,
    Ledger,
    crash_then_take_over,
    events,
    events_of,
    kinds_after,
    make_agent,
    make_tools,
)

pytestmark = pytest.mark.engines


def step(run: Run, index: int) -> Step:
    return Step.objects.get(run_id=run.pk, index=index)


# -- side effects put to a person ---------------------------------------------------------------


def test_interrupted_side_effect_waits_for_an_operator(database, tmp_path, clock, crash):
    ledger = Ledger(tmp_path / "ledger")
    agent = make_agent("ise", [ToolCall("read", {"key": "k"}), ToolCall("charge", {"amount": 5}),
                               FinalAnswer("done")], ledger)
    with registry.override(agent):
        run = start("ise", {}, clock=clock)
        run = crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_TOOL_EFFECT, 2)
        assert ledger.count("charge") == 1  # it did go out; the runtime cannot know that

        assert run.status == "waiting"
        assert run.lease_owner == "" and run.lease_expires_at is None
        s = step(run, 2)
        assert s.status == "interrupted" and s.attempt == 1 and s.result is None
        assert kinds_after(run, "step.tool_started") == [
            "lease.taken_over", "run.resumed", "step.interrupted", "approval.requested",
            "run.paused", "lease.released"]
        interrupted = events(run, "step.interrupted")[0].payload
        assert interrupted["was"] == "executing" and interrupted["dispatched"] is False
        assert interrupted["previous_owner"] == "worker-a"

        (approval,) = Approval.objects.filter(run_id=run.pk)
        assert approval.kind == "interrupted_side_effect" and approval.status == "pending"
        assert approval.step_id == s.pk
        assert (approval.tool, approval.arguments, approval.effect) == (
            "charge", {"amount": 5}, "side_effect")
        assert approval.digest == request_digest("charge", {"amount": 5}, "side_effect")
        requested = events(run, "approval.requested")[0].payload
        assert requested["approval_id"] == approval.pk
        assert requested["idempotency_key"] == s.idempotency_key

        text = approval.title + "\n" + approval.detail
        assert "charge" in approval.title
        assert "started" in text
        assert "the process stopped before its outcome was recorded" in text
        assert "whether it took effect is unknown" in text
        # the arguments and the key are the approval's own fields, shown beside the detail,
        # which tells what happened and does not repeat them
        assert "Check the outside world for its idempotency key" in text
        assert '"amount"' not in text and s.idempotency_key not in text
        assert "attempt 1" in text
        assert "worker-a" in text  # the owner that ran it

        with pytest.raises(RunNotResumable):  # nobody runs it again until a person decides
            resume(run.pk, owner="worker-c", clock=clock, lease_seconds=1)
    assert ledger.count("charge") == 1
    assert ledger.count("read") == 1
    assert verify(run.pk).ok


@pytest.mark.parametrize("case", ["read_only", "deciding", "deciding_in_llm", "deciding_planned"])
def test_interrupted_read_only_or_deciding_step_continues(database, tmp_path, clock, crash, case):
    ledger = Ledger(tmp_path / "ledger")
    if case == "deciding_planned":  # one LLM response asked for two calls; step 2 is planned
        script = [[ToolCall("read", {"key": "a"}), ToolCall("read", {"key": "b"})],
                  FinalAnswer("done")]
        point, index, reads = CrashPoint.AFTER_STEP_STARTED, 2, ["a", "b"]
    else:
        script = [ToolCall("read", {"key": "a"}), FinalAnswer("done")]
        point, index, reads = {
            "read_only": (CrashPoint.AFTER_TOOL_EFFECT, 1, ["a", "a"]),
            "deciding": (CrashPoint.AFTER_STEP_STARTED, 1, ["a"]),
            "deciding_in_llm": (CrashPoint.DURING_LLM_REQUEST, 1, ["a"]),
        }[case]
    llm = ScriptedLLM(script)
    agent = make_agent("roc", [], ledger, llm=llm)
    with registry.override(agent):
        run = start("roc", {}, clock=clock)
        run = crash_then_take_over(run.pk, clock, crash, point, index)
    assert run.status == "succeeded" and run.output == "done"
    assert [c["key"] for c in ledger.calls("read")] == reads
    assert not Approval.objects.filter(run_id=run.pk).exists()
    interrupted = events(run, "step.interrupted")
    assert [e.step_index for e in interrupted] == [index]
    after = kinds_after(run, "step.interrupted")
    if case == "read_only":
        assert interrupted[0].payload["was"] == "executing"
        assert after[:2] == ["step.tool_started", "step.tool_finished"]
        restarted = events(run, "step.tool_started")[-1].payload
        assert restarted["attempt"] == 2 and restarted["after"] == "interruption"
        assert [c["attempt"] for c in ledger.calls("read")] == [1, 2]
        assert step(run, 1).attempt == 2
    else:
        assert interrupted[0].payload["was"] == "deciding"
        assert step(run, index).status == "succeeded" and step(run, index).attempt == 1
        if case == "deciding_planned":  # decided again from the plan, no new LLM request
            assert after[:3] == ["step.started", "step.decided", "step.tool_started"]
            assert llm.calls == 2 and run.llm_requests == 2
        else:  # decided again (on the record): a fresh LLM request for the same step
            assert after[:5] == ["step.started", "llm.requested", "llm.responded",
                                 "step.decided", "step.tool_started"]
            assert run.llm_requests == 3  # the lost request, its repeat, and the final answer
    assert "side_effect.auto_confirmed" not in events_of(run)
    assert verify(run.pk).ok


def test_interrupted_read_only_step_over_its_attempt_cap_fails_the_run(database, tmp_path, clock,
                                                                        crash):
    ledger = Ledger(tmp_path / "ledger")
    agent = make_agent("cap", [ToolCall("read", {"key": "a"}), FinalAnswer("done")], ledger)
    with registry.override(agent):
        run = start("cap", {}, clock=clock)
        for n in range(3):  # the read tool's cap is 3 attempts; each one dies after its effect
            crash(CrashPoint.AFTER_TOOL_EFFECT, step_index=1)
            with pytest.raises(SimulatedCrash):
                resume(run.pk, owner=f"worker-{n}", clock=clock, lease_seconds=1)
            crashpoints.disarm()
            clock.advance(2)
        run = resume(run.pk, owner="worker-last", clock=clock, lease_seconds=1)
    assert run.status == "failed" and run.failure_code == "error"
    assert "read" in run.failure_message and "3" in run.failure_message
    assert [c["attempt"] for c in ledger.calls("read")] == [1, 2, 3]  # never a 4th
    assert kinds_after(run, "step.interrupted") == ["run.failed", "lease.released"]
    assert [e.payload["attempt"] for e in events(run, "step.tool_started")] == [1, 2, 3]
    assert run.lease_owner == ""
    assert verify(run.pk).ok


# -- reconciliation ------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", [
    Continue(), Complete({"charged": 5, "found": "by reconcile"}),
    Wait("Check the card processor", "Look the key up in the processor's dashboard."),
    Conflict("the order was refunded meanwhile"),
], ids=["continue", "complete", "wait", "conflict"])
def test_reconcile_outcomes(database, tmp_path, clock, crash, outcome):
    ledger, views = Ledger(tmp_path / "ledger"), []

    def reconcile(view):
        views.append(view)
        return outcome

    agent = make_agent("rec", [ToolCall("charge", {"amount": 5}), FinalAnswer("done")], ledger,
                       reconcile=reconcile)
    with registry.override(agent):
        run = start("rec", {}, clock=clock)
        run = crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_TOOL_EFFECT, 1)
    s = step(run, 1)

    (view,) = views
    assert view.idempotency_key == s.idempotency_key
    assert view.dispatched is False
    assert (view.tool, view.arguments, view.effect, view.attempt) == (
        "charge", {"amount": 5}, "side_effect", 1)
    assert view.step.index == 1 and view.run.pk == run.pk
    assert view.events[-1].kind == "step.interrupted"  # it sees the record up to the takeover

    decided = events(run, "reconcile.decided")
    assert len(decided) == 1 and decided[0].step_index == 1
    assert kinds_after(run, "step.interrupted")[0] == "reconcile.decided"
    after = kinds_after(run, "reconcile.decided")
    if isinstance(outcome, Continue):
        assert decided[0].payload["outcome"] == "continue"
        assert after[:2] == ["step.tool_started", "step.tool_finished"]
        assert events(run, "step.tool_started")[-1].payload["authorized_by"] == "reconcile"
        assert run.status == "succeeded"
        assert [c["attempt"] for c in ledger.calls("charge")] == [1, 2]  # the consumer vouched
        assert not Approval.objects.filter(run_id=run.pk).exists()
    elif isinstance(outcome, Complete):
        assert decided[0].payload == {"outcome": "complete", "result": outcome.result}
        assert after[:2] == ["step.tool_finished", "step.started"]
        assert events(run, "step.tool_finished")[0].payload["recovered_by"] == "reconcile"
        assert s.status == "succeeded" and s.result == outcome.result
        assert run.status == "succeeded" and run.output == "done"
        assert ledger.count("charge") == 1
        assert not Approval.objects.filter(run_id=run.pk).exists()
    elif isinstance(outcome, Wait):
        assert decided[0].payload["outcome"] == "wait"
        assert after == ["approval.requested", "run.paused", "lease.released"]
        assert run.status == "waiting" and s.status == "interrupted"
        (approval,) = Approval.objects.filter(run_id=run.pk)
        assert approval.kind == "reconcile" and approval.status == "pending"
        assert (approval.title, approval.detail) == (outcome.title, outcome.detail)
        assert approval.digest == request_digest("charge", {"amount": 5}, "side_effect")
        assert ledger.count("charge") == 1
    else:
        assert decided[0].payload == {"outcome": "conflict", "reason": outcome.reason}
        assert after == ["run.failed", "lease.released"]
        assert run.status == "failed" and run.failure_code == "reconcile_conflict"
        assert run.failure_message == outcome.reason
        assert ledger.count("charge") == 1
        assert not Approval.objects.filter(run_id=run.pk).exists()
    assert "side_effect.auto_confirmed" not in events_of(run)
    assert verify(run.pk).ok


@pytest.mark.parametrize("point,dispatched", [
    (CrashPoint.AFTER_TOOL_STARTED, False), (CrashPoint.AFTER_TOOL_DISPATCHED, True)])
def test_reconcile_view_says_whether_the_call_was_dispatched(
        database, tmp_path, clock, crash, point, dispatched):
    ledger, views = Ledger(tmp_path / "ledger"), []

    def reconcile(view):
        views.append(view)
        return Wait("Did the message go out?")

    agent = make_agent("recd", [ToolCall("send", {"to": "bob"}), FinalAnswer("done")], ledger,
                       reconcile=reconcile)
    with registry.override(agent):
        run = start("recd", {}, clock=clock)
        run = crash_then_take_over(run.pk, clock, crash, point, 1)
    (view,) = views
    assert view.dispatched is dispatched
    assert view.idempotency_key == step(run, 1).idempotency_key
    # reconcile comes first (§7.1): even a provably undispatched call is the consumer's to judge
    assert run.status == "waiting"
    assert Approval.objects.get(run_id=run.pk).kind == "reconcile"
    assert "side_effect.auto_confirmed" not in events_of(run)
    assert ledger.count("send") == 0
    assert verify(run.pk).ok


def test_a_continue_while_the_old_call_may_still_land_asks_a_person(
        database, tmp_path, clock, crash):
    """The worker inside the charge lost its lease without being proved dead (cut off or
    paused: its call may still be under way). The reconcile finds nothing yet and answers
    Continue; the runtime does not re-run the charge on that word but asks a person, saying
    why, and an approval then allows exactly one more attempt."""
    ledger, views = Ledger(tmp_path / "ledger"), []

    def reconcile(view):
        views.append(view)
        return Continue()

    agent = make_agent("recz", [ToolCall("charge", {"amount": 5}), FinalAnswer("done")], ledger,
                       reconcile=reconcile)
    with registry.override(agent):
        run = start("recz", {}, clock=clock)
        run = crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_TOOL_STARTED, 1,
                                   proved_dead=False)
        (view,) = views
        assert "worker-a lost the run without being proved dead" in view.may_still_land
        assert run.status == "waiting" and step(run, 1).status == "interrupted"
        assert ledger.count("charge") == 0  # nothing re-ran on the reconcile's word
        (decided,) = events(run, "reconcile.decided")
        assert decided.payload["outcome"] == "continue" and "worker-a" in decided.payload["held"]
        assert kinds_after(run, "reconcile.decided") == [
            "approval.requested", "run.paused", "lease.released"]
        (approval,) = Approval.objects.filter(run_id=run.pk)
        assert approval.kind == "reconcile" and approval.status == "pending"
        assert "may still be under way" in approval.detail
        approve(approval.pk, by="alice")
        run = resume(run.pk, owner="worker-c", clock=clock, lease_seconds=1)
    assert run.status == "succeeded"
    assert [c["attempt"] for c in ledger.calls("charge")] == [2]
    assert events(run, "step.tool_started")[-1].payload["attempt"] == 2
    assert verify(run.pk).ok


def test_a_takeover_of_a_proved_dead_owner_says_so_on_the_interruption(database, tmp_path, clock,
                                                                     crash):
    """Proof of death is asked for even after the lease expired, and recorded on the step's
    interruption: it is what lets a reconcile's Continue re-run at once."""
    ledger = Ledger(tmp_path / "ledger")
    agent = make_agent("recd", [ToolCall("charge", {"amount": 5}), FinalAnswer("done")], ledger)
    with registry.override(agent):
        for proved in (True, False):
            run = start("recd", {}, clock=clock)
            run = crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_TOOL_STARTED, 1,
                                       proved_dead=proved)
            (interrupted,) = events(run, "step.interrupted")
            assert interrupted.payload["previous_owner_dead"] is proved
            (taken,) = events(run, "lease.taken_over")
            assert taken.payload["reason"] == ("owner proved dead" if proved else "lease expired")
            assert run.status == "waiting"  # no reconcile: a person decides either way


@pytest.mark.parametrize("point", [CrashPoint.AFTER_TOOL_EFFECT, CrashPoint.AFTER_TOOL_STARTED],
                         ids=["went_out", "never_went_out"])
def test_interrupted_step_is_reconciled_and_continued(database, tmp_path, clock, crash, point):
    """The seed's example: the consumer looks the idempotency key up in the outside world."""
    ledger, transcripts = Ledger(tmp_path / "ledger"), []

    def reconcile(view):
        found = [c for c in ledger.calls("charge") if c["key"] == view.idempotency_key]
        if found:
            return Complete({"charged": found[-1]["amount"], "recovered": True})
        return Continue()

    def script(transcript):
        transcripts.append(list(transcript.entries))
        if not transcript.entries:
            return ToolCall("charge", {"amount": 7})
        if len(transcript.entries) == 1:
            return ToolCall("read", {"key": "receipt"})
        return FinalAnswer({"charge": transcript.entries[0].result})

    agent = Agent("recc", ScriptedLLM(script), make_tools(ledger), reconcile=reconcile)
    with registry.override(agent):
        run = start("recc", {}, clock=clock)
        run = crash_then_take_over(run.pk, clock, crash, point, 1)
    assert run.status == "succeeded"
    assert ledger.count("charge") == 1  # exactly once, either way
    assert ledger.count("read") == 1
    outcome = events(run, "reconcile.decided")[0].payload["outcome"]
    if point == CrashPoint.AFTER_TOOL_EFFECT:
        assert outcome == "complete"
        assert run.output == {"charge": {"charged": 7, "recovered": True}}
    else:
        assert outcome == "continue"
        assert run.output == {"charge": {"charged": 7}}
    assert [s.status for s in Step.objects.filter(run_id=run.pk).order_by("index")] == [
        "succeeded"] * 3
    assert not Approval.objects.filter(run_id=run.pk).exists()
    assert verify(run.pk).ok


def _stricter_tools(ledger: Ledger) -> list:
    read, _charge, send = make_tools(ledger)

    @tool(effect="side_effect")
    def charge(ctx: ToolContext, amount: int, currency: str) -> dict:
        """Charge a card (now needs a currency)."""
        ledger.record("charge", amount=amount, key=ctx.idempotency_key, attempt=ctx.attempt)
        return {"charged": amount, "currency": currency}

    return [read, charge, send]


@pytest.mark.parametrize("when", ["on_takeover", "after_approval"])
@pytest.mark.parametrize("change", ["unregistered", "stricter_schema"])
def test_unregistered_tool_or_bad_arguments_is_a_reconcile_conflict(
        database, tmp_path, clock, crash, change, when):
    ledger = Ledger(tmp_path / "ledger")
    script = [ToolCall("charge", {"amount": 5}), FinalAnswer("done")]
    agent = make_agent("gone", script, ledger)
    tools = ([t for t in make_tools(ledger) if t.name != "charge"] if change == "unregistered"
             else _stricter_tools(ledger))
    swapped = Agent("gone", ScriptedLLM(script), tools)
    with registry.override(agent):
        run = start("gone", {}, clock=clock)
        crash(CrashPoint.AFTER_TOOL_EFFECT, step_index=1)
        with pytest.raises(SimulatedCrash):
            resume(run.pk, owner="worker-a", clock=clock, lease_seconds=1)
        crashpoints.disarm()
        clock.advance(2)
        if when == "after_approval":
            assert resume(run.pk, owner="worker-b", clock=clock, lease_seconds=1).status == \
                "waiting"
            approve(pending().get(run_id=run.pk).pk, by="alice")
        with registry.override(swapped):  # a deploy changed the agent while the run was down
            run = resume(run.pk, owner="worker-c", clock=clock, lease_seconds=1)
    assert run.status == "failed" and run.failure_code == "reconcile_conflict"
    expected = "no longer registered" if change == "unregistered" else "schema"
    assert expected in run.failure_message
    decided = events(run, "reconcile.decided")
    assert len(decided) == 1
    assert decided[0].payload["outcome"] == "conflict" and decided[0].payload["by"] == "runtime"
    assert kinds_after(run, "reconcile.decided") == ["run.failed", "lease.released"]
    assert "approval.consumed" not in events_of(run)
    # nothing to approve: no new approval was asked for
    assert Approval.objects.filter(run_id=run.pk, status="pending").count() == 0
    assert Approval.objects.filter(run_id=run.pk).count() == (1 if when == "after_approval" else 0)
    assert ledger.count("charge") == 1
    assert events(run, "step.tool_started")[-1].payload["attempt"] == 1
    assert verify(run.pk).ok


def test_crash_during_the_takeover_still_waits_for_an_operator(database, tmp_path, clock, crash):
    """The heir dies right after recording the interruption; the next heir must not take the
    already-interrupted step for anything but an unknown outcome."""
    ledger = Ledger(tmp_path / "ledger")
    agent = make_agent("twice", [ToolCall("charge", {"amount": 5}), FinalAnswer("done")], ledger)
    with registry.override(agent):
        run = start("twice", {}, clock=clock)
        crash(CrashPoint.AFTER_TOOL_EFFECT, step_index=1)
        with pytest.raises(SimulatedCrash):
            resume(run.pk, owner="worker-a", clock=clock, lease_seconds=1)
        clock.advance(2)
        run = crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_STEP_INTERRUPTED, 1,
                                   dead="worker-b", heir="worker-c")
    assert run.status == "waiting"
    assert ledger.count("charge") == 1
    (approval,) = Approval.objects.filter(run_id=run.pk)
    assert approval.kind == "interrupted_side_effect"
    assert "worker-a" in approval.detail  # the owner that ran the call, not the first heir
    kinds = events_of(run)
    assert kinds.count("step.interrupted") == 1 and kinds.count("lease.taken_over") == 2
    assert kinds_after(run, "step.tool_started") == [
        "lease.taken_over", "run.resumed", "step.interrupted",
        "lease.taken_over", "run.resumed", "approval.requested", "run.paused", "lease.released"]
    assert verify(run.pk).ok


# -- the dispatch proof --------------------------------------------------------------------------


def test_undispatched_side_effect_is_rerun_automatically(database, tmp_path, clock, crash):
    ledger = Ledger(tmp_path / "ledger")
    agent = make_agent("und", [ToolCall("send", {"to": "bob"}), FinalAnswer("done")], ledger)
    with registry.override(agent):
        run = start("und", {}, clock=clock)
        run = crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_TOOL_STARTED, 1)
    assert run.status == "succeeded" and run.output == "done"
    assert ledger.count("send") == 1
    assert ledger.calls("send")[0]["attempt"] == 2
    assert events(run, "step.interrupted")[0].payload["dispatched"] is False
    assert kinds_after(run, "step.interrupted")[:4] == [
        "side_effect.auto_confirmed", "step.tool_started", "step.tool_dispatched",
        "step.tool_finished"]
    confirmed = events(run, "side_effect.auto_confirmed")[0]
    assert confirmed.step_index == 1 and confirmed.payload["attempt"] == 1
    assert "never went out" in confirmed.payload["reason"]
    assert confirmed.actor == "worker-b"
    assert events(run, "step.tool_started")[-1].payload["authorized_by"] == "dispatch proof"
    assert not Approval.objects.filter(run_id=run.pk).exists()
    assert verify(run.pk).ok


def test_undispatched_side_effect_is_rerun_automatically_and_the_stalled_worker_is_fenced(
        database, tmp_path, clock):
    """The first worker stalls inside ``send`` before ctx.dispatch(); it wakes after the
    takeover re-ran the call, and its dispatch is refused: the call goes out exactly once."""
    ledger, gate = Ledger(tmp_path / "ledger"), Gate(once=True)
    agent = make_agent("stall", [ToolCall("send", {"to": "bob"}), FinalAnswer("done")], ledger,
                       {"send.before": gate})
    with registry.override(agent):
        run = start("stall", {}, clock=clock)
        stalled = Background(lambda: resume(run.pk, owner="worker-a", clock=clock,
                                            lease_seconds=1,
                                            keeper=LeaseKeeper(1, clock=clock)))  # no heartbeat
        gate.wait_inside()
        clock.advance(2)
        run = resume(run.pk, owner="worker-b", clock=clock, lease_seconds=1)
        assert run.status == "succeeded"
        gate.release.set()
        stalled.join()
    assert isinstance(stalled.error, LeaseLost)
    assert ledger.count("send") == 1
    assert ledger.calls("send")[0]["attempt"] == 2
    taken = events(run, "lease.taken_over")[0]
    later = Event.objects.filter(run_id=run.pk, seq__gt=taken.seq)
    assert "worker-a" not in set(later.values_list("actor", flat=True))
    assert events_of(run).count("step.tool_dispatched") == 1
    assert "side_effect.auto_confirmed" in events_of(run)
    assert verify(run.pk).ok


def test_dispatched_side_effect_waits_for_an_operator(database, tmp_path, clock, crash):
    ledger = Ledger(tmp_path / "ledger")
    agent = make_agent("dsp", [ToolCall("send", {"to": "bob"}), FinalAnswer("done")], ledger)
    with registry.override(agent):
        run = start("dsp", {}, clock=clock)
        run = crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_TOOL_DISPATCHED, 1)
        assert run.status == "waiting"
        assert events(run, "step.interrupted")[0].payload["dispatched"] is True
        assert kinds_after(run, "step.tool_dispatched") == [
            "lease.taken_over", "run.resumed", "step.interrupted", "approval.requested",
            "run.paused", "lease.released"]
        (approval,) = Approval.objects.filter(run_id=run.pk)
        assert approval.kind == "interrupted_side_effect" and approval.status == "pending"
        assert "whether it took effect is unknown" in approval.detail
        assert approval.arguments == {"to": "bob"}
        assert ledger.count("send") == 0  # (the simulated crash beat the call to the ledger)
        approve(approval.pk, by="alice")
        run = resume(run.pk, owner="worker-c", clock=clock, lease_seconds=1)
    assert run.status == "succeeded"
    assert [c["attempt"] for c in ledger.calls("send")] == [2]
    assert "side_effect.auto_confirmed" not in events_of(run)
    assert verify(run.pk).ok


def test_dispatched_side_effect_waits_for_an_operator_and_the_late_result_is_not_recorded(
        database, tmp_path, clock):
    ledger, gate = Ledger(tmp_path / "ledger"), Gate()
    agent = make_agent("late", [ToolCall("send", {"to": "bob"}), FinalAnswer("done")], ledger,
                       {"send": gate})  # held after the call went out, before its result
    with registry.override(agent):
        run = start("late", {}, clock=clock)
        stalled = Background(lambda: resume(run.pk, owner="worker-a", clock=clock,
                                            lease_seconds=1,
                                            keeper=LeaseKeeper(1, clock=clock)))
        gate.wait_inside()
        clock.advance(2)
        run = resume(run.pk, owner="worker-b", clock=clock, lease_seconds=1)
        gate.release.set()
        stalled.join()
    assert isinstance(stalled.error, LeaseLost)
    assert run.status == "waiting"
    assert Approval.objects.get(run_id=run.pk).kind == "interrupted_side_effect"
    assert ledger.count("send") == 1
    assert "step.tool_finished" not in events_of(run)
    s = step(run, 1)
    assert s.status == "interrupted" and s.result is None
    assert Run.objects.get(pk=run.pk).status == "waiting"
    assert verify(run.pk).ok


def test_undispatched_attempt_after_an_approval_is_rerun_automatically(database, tmp_path, clock,
                                                                       crash):
    """Attempt 1 dispatched (a person approved attempt 2); attempt 2 died before its dispatch:
    the proof covers attempt 2 alone, so attempt 3 runs without a second approval."""
    ledger = Ledger(tmp_path / "ledger")
    agent = make_agent("dp2", [ToolCall("send", {"to": "bob"}), FinalAnswer("done")], ledger)
    with registry.override(agent):
        run = start("dp2", {}, clock=clock)
        run = crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_TOOL_DISPATCHED, 1)
        approve(pending().get(run_id=run.pk).pk, by="alice")
        crash(CrashPoint.AFTER_TOOL_STARTED, step_index=1)
        with pytest.raises(SimulatedCrash):
            resume(run.pk, owner="worker-c", clock=clock, lease_seconds=1)
        crashpoints.disarm()
        clock.advance(2)
        run = resume(run.pk, owner="worker-d", clock=clock, lease_seconds=1)
    assert run.status == "succeeded"
    assert [c["attempt"] for c in ledger.calls("send")] == [3]
    confirmed = events(run, "side_effect.auto_confirmed")
    assert [e.payload["attempt"] for e in confirmed] == [2]
    assert [e.payload["attempt"] for e in events(run, "step.tool_started")] == [1, 2, 3]
    consumed = Approval.objects.filter(run_id=run.pk, status="consumed").count()
    assert consumed == 1 and Approval.objects.filter(run_id=run.pk).count() == 1
    assert verify(run.pk).ok


def test_dispatch_proof_needs_the_attempt_that_ran_to_have_promised_dispatch(database, tmp_path,
                                                                              clock, crash):
    ledger = Ledger(tmp_path / "ledger")
    script = [ToolCall("charge", {"amount": 5}), FinalAnswer("done")]
    agent = make_agent("dp", script, ledger)
    read, _charge, send = make_tools(ledger)

    @tool(effect="side_effect", dispatches=True)
    def charge(ctx: ToolContext, amount: int) -> dict:
        """Charge a card; this version announces its outbound call."""
        ctx.dispatch()
        ledger.record("charge", amount=amount, key=ctx.idempotency_key, attempt=ctx.attempt)
        return {"charged": amount}

    upgraded = Agent("dp", ScriptedLLM(script), [read, charge, send])
    with registry.override(agent):
        run = start("dp", {}, clock=clock)
        crash(CrashPoint.AFTER_TOOL_EFFECT, step_index=1)
        with pytest.raises(SimulatedCrash):
            resume(run.pk, owner="worker-a", clock=clock, lease_seconds=1)
        crashpoints.disarm()
        clock.advance(2)
        assert ledger.count("charge") == 1  # the old version charged, announcing nothing
        with registry.override(upgraded):
            run = resume(run.pk, owner="worker-b", clock=clock, lease_seconds=1)
    assert ledger.count("charge") == 1
    assert run.status == "waiting"


# -- idempotency keys ----------------------------------------------------------------------------


def test_idempotency_key_is_stable_across_attempts(database, tmp_path, clock, crash):
    ledger = Ledger(tmp_path / "ledger")
    agent = make_agent("idem", [ToolCall("charge", {"amount": 1}),
                                ToolCall("charge", {"amount": 2}), FinalAnswer("done")], ledger)
    with registry.override(agent):
        run = start("idem", {}, clock=clock)
        run = crash_then_take_over(run.pk, clock, crash, CrashPoint.AFTER_TOOL_EFFECT, 2)
        approve(pending().get(run_id=run.pk).pk, by="alice")
        run = resume(run.pk, owner="worker-c", clock=clock, lease_seconds=1)
    assert run.status == "succeeded"
    calls = ledger.calls("charge")
    assert [(c["amount"], c["attempt"]) for c in calls] == [(1, 1), (2, 1), (2, 2)]
    first, second, again = (c["key"] for c in calls)
    assert second == again  # the key the tool saw on attempt 1 and on the approved attempt 2
    assert first != second  # and it belongs to the step, not the run
    assert second == step(run, 2).idempotency_key
    started = [e.payload["idempotency_key"] for e in events(run, "step.started")]
    assert started[:2] == [first, second]
    assert json.dumps(second) in json.dumps(events(run, "approval.requested")[0].payload)
    assert verify(run.pk).ok
