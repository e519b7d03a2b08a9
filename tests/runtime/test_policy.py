"""Design §9 (and §5.4): the agent's policy — allow, require approval, deny — evaluated before a
tool starts, and again when an approved request is about to start."""

from __future__ import annotations

import pytest

from runtime import (
    Agent,
    Allow,
    Deny,
    FinalAnswer,
    RequireApproval,
    ScriptedLLM,
    ToolCall,
    crashpoints,
    resume,
    start,
)
from runtime.agents.agent import registry
from runtime.agents.policy import Request
from runtime.approvals.decisions import approve
from runtime.audit.chain import verify
from runtime.canonical import request_digest
from runtime.crashpoints import CrashPoint
from runtime.errors import RunNotResumable, SimulatedCrash
from runtime.models import Approval, Step
from tests.kit import Ledger, events, events_of, kinds_after, make_tools

SCRIPT = [ToolCall("read", {"key": "k"}), ToolCall("charge", {"amount": 9}), FinalAnswer("done")]


class Switchable:
    """A policy the test can change between calls; records every request it judged."""

    def __init__(self, verdict) -> None:
        self.verdict = verdict
        self.seen: list[Request] = []

    def __call__(self, request: Request, run) -> object:
        self.seen.append(request)
        return self.verdict if request.tool == "charge" else Allow()


def _agent(name: str, ledger: Ledger, policy: Switchable) -> Agent:
    return Agent(name, ScriptedLLM(SCRIPT), make_tools(ledger), policy=policy)




def test_require_approval_pauses_before_the_tool_starts(sqlite_path, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    policy = Switchable(RequireApproval("Charge 9?", "The agent wants to charge the card 9."))
    with registry.override(_agent("pol", ledger, policy)):
        run = start("pol", {}, clock=clock)
        run = resume(run.pk, owner="worker-a", clock=clock, lease_seconds=1)
        with pytest.raises(RunNotResumable):
            resume(run.pk, owner="worker-b", clock=clock, lease_seconds=1)
    assert run.status == "waiting"
    assert run.lease_owner == "" and run.lease_expires_at is None  # lease released
    assert ledger.count("charge") == 0 and ledger.count("read") == 1
    assert policy.seen[-1] == Request("charge", {"amount": 9}, "side_effect", 2)
    s = Step.objects.get(run_id=run.pk, index=2)
    assert s.status == "waiting" and s.attempt == 0
    assert kinds_after(run, "step.decided") == [
        "approval.requested", "run.paused", "lease.released"]
    assert [e.step_index for e in events(run, "step.tool_started")] == [1]  # step 2 never started
    assert events(run, "run.paused")[0].payload["reason"] == "policy"
    (approval,) = Approval.objects.filter(run_id=run.pk)
    assert approval.kind == "policy" and approval.status == "pending" and approval.step_id == s.pk
    assert (approval.title, approval.detail) == ("Charge 9?",
                                                "The agent wants to charge the card 9.")
    assert (approval.tool, approval.arguments, approval.effect) == (
        "charge", {"amount": 9}, "side_effect")
    assert approval.digest == request_digest("charge", {"amount": 9}, "side_effect")
    assert verify(run.pk).ok


def test_allowed_after_approval_the_tool_runs_once(sqlite_path, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    policy = Switchable(RequireApproval("Charge 9?"))  # still requires approval when re-asked
    with registry.override(_agent("pola", ledger, policy)):
        run = start("pola", {}, clock=clock)
        run = resume(run.pk, clock=clock, lease_seconds=1)
        approval = Approval.objects.get(run_id=run.pk)
        approve(approval.pk, by="alice")
        run = resume(run.pk, clock=clock, lease_seconds=1)
    assert run.status == "succeeded"
    assert [c["attempt"] for c in ledger.calls("charge")] == [1]
    assert [r.tool for r in policy.seen].count("charge") == 2  # evaluated again at the start
    assert Approval.objects.get(pk=approval.pk).status == "consumed"
    assert kinds_after(run, "run.resumed")[:3] == [
        "approval.consumed", "step.tool_started", "step.tool_finished"]
    assert verify(run.pk).ok


def test_deny_fails_the_run_policy_denied(sqlite_path, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    policy = Switchable(Deny("charges are frozen"))
    with registry.override(_agent("pold", ledger, policy)):
        run = start("pold", {}, clock=clock)
        run = resume(run.pk, clock=clock, lease_seconds=1)
    assert run.status == "failed" and run.failure_code == "policy_denied"
    assert run.failure_message == "charges are frozen"
    assert run.lease_owner == ""
    assert ledger.count("charge") == 0
    assert kinds_after(run, "step.decided") == ["policy.denied", "run.failed", "lease.released"]
    denied = events(run, "policy.denied")[0]
    assert denied.step_index == 2
    assert denied.payload == {"reason": "charges are frozen", "tool": "charge"}
    assert Step.objects.get(run_id=run.pk, index=2).status == "failed"
    assert not Approval.objects.filter(run_id=run.pk).exists()
    assert verify(run.pk).ok


def test_policy_that_raises_fails_the_run_without_calling_the_tool(sqlite_path, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")

    def policy(request, run):
        if request.tool == "charge":
            raise RuntimeError("policy service down")
        return Allow()

    agent = Agent("polx", ScriptedLLM(SCRIPT), make_tools(ledger), policy=policy)
    with registry.override(agent):
        run = resume(start("polx", {}, clock=clock).pk, clock=clock, lease_seconds=1)
    assert run.status == "failed" and run.failure_code == "error"
    assert "policy service down" in run.failure_message
    assert ledger.count("charge") == 0
    assert verify(run.pk).ok


@pytest.mark.parametrize("kind", ["policy", "interrupted_side_effect"])
def test_policy_is_reevaluated_when_the_approval_is_consumed(
        sqlite_path, tmp_path, clock, crash, kind):
    ledger = Ledger(tmp_path / "ledger")
    policy = Switchable(RequireApproval("Charge 9?") if kind == "policy" else Allow())
    with registry.override(_agent("pre", ledger, policy)):
        run = start("pre", {}, clock=clock)
        if kind == "interrupted_side_effect":
            crash(CrashPoint.AFTER_TOOL_EFFECT, step_index=2)
            with pytest.raises(SimulatedCrash):
                resume(run.pk, owner="worker-a", clock=clock, lease_seconds=1)
            crashpoints.disarm()
            clock.advance(2)
        run = resume(run.pk, owner="worker-b", clock=clock, lease_seconds=1)
        assert run.status == "waiting"
        approval = Approval.objects.get(run_id=run.pk, status="pending")
        assert approval.kind == kind
        before = ledger.count("charge")
        approve(approval.pk, by="alice")
        policy.verdict = Deny("card frozen since the approval")
        judged = len(policy.seen)
        run = resume(run.pk, owner="worker-c", clock=clock, lease_seconds=1)
    assert run.status == "failed" and run.failure_code == "policy_denied"
    assert run.failure_message == "card frozen since the approval"
    assert len(policy.seen) == judged + 1  # asked again when the approval was to be used
    assert policy.seen[-1] == Request("charge", {"amount": 9}, "side_effect", 2)
    assert ledger.count("charge") == before  # the tool was not called
    assert kinds_after(run, "approval.granted") == [
        "lease.taken", "run.resumed", "policy.denied", "approval.cancelled", "run.failed",
        "lease.released"]
    assert "approval.consumed" not in events_of(run)
    assert Step.objects.get(run_id=run.pk, index=2).status == "failed"
    unused = Approval.objects.get(pk=approval.pk)
    assert unused.consumed_at is None and unused.status == "cancelled"  # not left "approved"
    assert verify(run.pk).ok
