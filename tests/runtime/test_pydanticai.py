"""A Pydantic AI agent as a runtime agent: its model requests and tool calls are the run's
record, a resumed run gets them back without asking again, and an interrupted side effect
waits for a person. Model requests are counted by the model itself and side effects by the
outside world's ledger (``tests.pai_agents``)."""

from __future__ import annotations

import json

import pytest
from pydantic_ai.models.function import FunctionModel

from runtime import resume, start
from runtime.agents.agent import registry
from runtime.approvals.decisions import approve, reject, resolve
from runtime.audit.chain import verify
from runtime.crashpoints import CrashPoint
from runtime.errors import SimulatedCrash
from runtime.models import Approval, Run, Step
from runtime.selectors.approvals import pending
from tests import pai_agents
from tests.kit import crash_then_take_over, events, events_of

pytestmark = pytest.mark.engines


@pytest.fixture
def desk(tmp_path, monkeypatch):
    monkeypatch.setattr(pai_agents, "DIR", tmp_path)
    agent = pai_agents.build()
    with registry.override(agent):
        yield agent


def test_a_pydantic_ai_agent_runs_to_the_end_with_its_record(database, clock, desk, tmp_path):
    run = resume(start("pai-refunds", "refund A-17", clock=clock).pk, clock=clock)
    assert run.status == "succeeded", run.failure_message
    assert "note sent for A-17" in run.output
    steps = list(Step.objects.filter(run=run).order_by("index"))
    assert [(s.tool, s.effect, s.status) for s in steps] == [
        ("lookup_order", "read_only", "succeeded"), ("refund", "side_effect", "succeeded"),
        ("send_note", "side_effect", "succeeded")]
    assert steps[1].result["key"] == steps[1].idempotency_key
    assert len(events(run, "llm.requested")) == len(events(run, "llm.responded")) == 3
    assert run.llm_requests == 3 and run.tokens_in > 0 and run.tokens_out > 0
    assert [e.payload["effect_source"] for e in events(run, "step.decided")] == [
        "declared in the tool's metadata", "no declaration: treated as a side effect",
        "declared in the tool's metadata"]
    assert events(run, "step.tool_dispatched")
    ledger = pai_agents.ledger()
    assert [c["call"] for c in ledger.calls() if c["call"] != "model"] == [
        "lookup_order", "refund", "send_note"]
    assert len(pai_agents.requests_made()) == 3
    assert verify(run.pk).ok


@pytest.mark.parametrize("point,index", [
    (CrashPoint.DURING_LLM_REQUEST, 1), (CrashPoint.AFTER_STEP_DECIDED, 1),
    (CrashPoint.AFTER_TOOL_STARTED, 1), (CrashPoint.AFTER_TOOL_EFFECT, 1),
    (CrashPoint.AFTER_TOOL_FINISHED, 1), (CrashPoint.DURING_LLM_REQUEST, 2),
    (CrashPoint.AFTER_STEP_DECIDED, 2), (CrashPoint.AFTER_TOOL_STARTED, 2),
    (CrashPoint.AFTER_TOOL_DISPATCHED, 2), (CrashPoint.AFTER_TOOL_EFFECT, 2),
    (CrashPoint.AFTER_TOOL_FINISHED, 2), (CrashPoint.AFTER_TOOL_EFFECT, 3),
    (CrashPoint.DURING_LLM_REQUEST, 4)])
def test_a_crash_anywhere_repeats_no_recorded_request_and_no_side_effect(
        database, clock, crash, desk, point, index):
    run = crash_then_take_over(start("pai-refunds", "refund A-17", clock=clock).pk, clock,
                               crash, point, index)
    held = list(pending().filter(run_id=run.pk))
    if held:
        assert [a.kind for a in held] == ["interrupted_side_effect"]
        approve(held[0].pk, by="olga")
        run = resume(run.pk, clock=clock, lease_seconds=1)
    assert run.status == "succeeded", run.failure_message
    ledger = pai_agents.ledger()
    assert ledger.count("refund") == 1 + (1 if held and held[0].step.tool == "refund"
                                         and point == CrashPoint.AFTER_TOOL_EFFECT else 0)
    assert ledger.count("send_note") <= 1 + (1 if held and held[0].step.tool == "send_note"
                                             else 0)
    # The model was sent each request once: a recorded response is given back, and the crash
    # "during" a request comes after its record and before it goes out.
    assert [c["request"] for c in pai_agents.requests_made()] == [1, 2, 3]
    assert verify(run.pk).ok


def test_it_happened_gives_the_agent_the_entered_result(database, clock, crash, desk):
    run = crash_then_take_over(start("pai-refunds", "refund A-17", clock=clock).pk, clock,
                               crash, CrashPoint.AFTER_TOOL_EFFECT, 2)
    (held,) = pending().filter(run_id=run.pk)
    assert held.tool == "refund" and held.kind == "interrupted_side_effect"
    resolve(held.pk, by="olga", result={"refunded": 1250, "found": "in the bank's log"})
    run = resume(run.pk, clock=clock, lease_seconds=1)
    assert run.status == "succeeded", run.failure_message
    assert pai_agents.ledger().count("refund") == 1
    # The agent's next model request shows the entered result as the tool's return value.
    seen = json.loads(pai_agents.requests_made()[-1]["seen"])
    assert seen[1] == {"refunded": 1250, "found": "in the bank's log"}, seen


def test_end_the_run_ends_it(database, clock, crash, desk):
    run = crash_then_take_over(start("pai-refunds", "refund A-17", clock=clock).pk, clock,
                               crash, CrashPoint.AFTER_TOOL_STARTED, 2)
    (held,) = pending().filter(run_id=run.pk)
    reject(held.pk, by="olga", note="refunded by hand")
    run.refresh_from_db()
    assert run.status == "failed"
    assert pai_agents.ledger().count("refund") == 0


def test_a_model_retry_is_replayed_not_redone(database, clock, crash, tmp_path, monkeypatch):
    monkeypatch.setattr(pai_agents, "DIR", tmp_path)
    with registry.override(pai_agents.build_retrying()):
        run = crash_then_take_over(start("pai-retry", "go", clock=clock).pk, clock, crash,
                                   CrashPoint.DURING_LLM_REQUEST, 3)
    assert run.status == "succeeded", run.failure_message
    assert [c["n"] for c in pai_agents.ledger().calls("flaky")] == [0, 1]
    assert [s.error.startswith("ModelRetry") for s in Step.objects.filter(run=run)
            .order_by("index")] == [True, False]
    assert verify(run.pk).ok
    assert "llm.requested" in events_of(run)



def test_requires_approval_tools_wait_for_a_person_one_by_one(database, clock, tmp_path,
                                                              monkeypatch):
    monkeypatch.setattr(pai_agents, "DIR", tmp_path)
    with registry.override(pai_agents.build_gated()):
        run = resume(start("pai-gated", "wire it", clock=clock).pk, clock=clock)
        assert run.status == "waiting"
        (first,) = pending().filter(run_id=run.pk)
        assert (first.kind, first.tool, first.arguments) == (
            "policy", "wire_money", {"to": "acme", "cents": 900})
        approve(first.pk, by="olga")
        run = resume(run.pk, clock=clock)
        assert run.status == "waiting"
        (second,) = pending().filter(run_id=run.pk)
        assert second.tool == "close_account"
        assert pai_agents.ledger().count("wire_money") == 0  # nothing runs until both are allowed
        approve(second.pk, by="olga")
        run = resume(run.pk, clock=clock)
    assert run.status == "succeeded", run.failure_message
    ledger = pai_agents.ledger()
    assert ledger.count("wire_money") == ledger.count("close_account") == 1
    seen = json.loads(pai_agents.requests_made()[-1]["seen"])
    assert seen == [{"to": "acme", "wired": 900}, "closed acme"]
    assert len(pai_agents.requests_made()) == 2  # the first response was given back twice
    assert verify(run.pk).ok


def test_a_rejected_approval_ends_the_run_and_nothing_runs(database, clock, tmp_path,
                                                            monkeypatch):
    monkeypatch.setattr(pai_agents, "DIR", tmp_path)
    with registry.override(pai_agents.build_gated()):
        run = resume(start("pai-gated", "wire it", clock=clock).pk, clock=clock)
        (first,) = pending().filter(run_id=run.pk)
        reject(first.pk, by="olga", note="not to acme")
    run.refresh_from_db()
    assert run.status == "failed"
    assert pai_agents.ledger().count("wire_money") == 0


def test_the_runtime_policy_applies_to_pydantic_ai_calls(database, clock, tmp_path, monkeypatch):
    from runtime import Deny, RequireApproval

    monkeypatch.setattr(pai_agents, "DIR", tmp_path)

    def policy(request, run):
        if request.tool == "refund":
            return RequireApproval(f"Refund {request.arguments['cents']} cents?")
        if request.tool == "send_note" and request.effect == "side_effect":
            return Deny("no emails today")
        return None

    with registry.override(pai_agents.build(policy=policy)):
        run = resume(start("pai-refunds", "refund A-17", clock=clock).pk, clock=clock)
        (held,) = pending().filter(run_id=run.pk)
        assert (held.kind, held.title) == ("policy", "Refund 1250 cents?")
        approve(held.pk, by="olga")
        run = resume(run.pk, clock=clock)
    assert run.status == "failed" and run.failure_code == "policy_denied"
    ledger = pai_agents.ledger()
    assert ledger.count("refund") == 1 and ledger.count("send_note") == 0


def test_the_operators_setting_wins_over_the_tools_declaration(database, clock, crash,
                                                               tmp_path, monkeypatch):
    monkeypatch.setattr(pai_agents, "DIR", tmp_path)
    with registry.override(pai_agents.build(effects={"lookup_order": "side_effect"})):
        run = crash_then_take_over(start("pai-refunds", "x", clock=clock).pk, clock, crash,
                                   CrashPoint.AFTER_TOOL_EFFECT, 1)
    (held,) = pending().filter(run_id=run.pk)
    assert held.tool == "lookup_order" and held.effect == "side_effect"
    (decided,) = events(run, "step.decided")
    assert decided.payload["effect_source"] == "set by configuration"


@pytest.mark.parametrize("loop", ["asyncio", "threads"])
def test_runworker_runs_pydantic_ai_agents(database, tmp_path, spawn, loop, monkeypatch):
    """A real worker (the event loop by default, and the thread worker) runs eight Pydantic AI
    runs side by side to their ends; each made each model request once."""
    monkeypatch.setattr(pai_agents, "DIR", tmp_path)
    with registry.override(pai_agents.build()):
        runs = [start("pai-refunds", f"refund {i}") for i in range(8)]
    worker = spawn("--burst", "--concurrency", "4", "--loop", loop,
                   env={"RUNTIME_AGENTS": "tests.agents.AGENTS,tests.pai_agents.AGENTS"})
    assert worker.wait(120) == 0, worker.output()
    for run in runs:
        run.refresh_from_db()
        assert run.status == "succeeded", (run.failure_message, worker.output())
        assert run.llm_requests == 3 and run.tokens_in > 0
        assert verify(run.pk).ok
    ledger = pai_agents.ledger()
    assert sorted(c["run"] for c in ledger.calls("refund")) == sorted(r.pk for r in runs)
    assert len(pai_agents.requests_made()) == 3 * len(runs)


def test_an_agent_that_asks_for_other_calls_when_resumed_ends_the_run(database, clock, crash,
                                                                       desk):
    """A deploy between two executions renamed a tool: the recorded response asks for a tool
    the agent no longer has, so the next call differs from what step 1 recorded."""
    run = start("pai-refunds", "refund A-18", clock=clock)
    crash(CrashPoint.AFTER_TOOL_FINISHED, step_index=1)
    with pytest.raises(SimulatedCrash):
        resume(run.pk, clock=clock, owner="worker-a")
    renamed = pai_agents.build()
    renamed.pydantic_agent._function_toolset.tools["lookup_order"].name = "find_order"
    clock.advance(60)
    with registry.override(renamed):
        run = resume(run.pk, clock=clock, owner="worker-b")
    assert run.status == "failed"
    assert "ReplayDiverged" in run.failure_message, run.failure_message
    assert pai_agents.ledger().count("refund") == 0


def test_a_pydantic_ai_run_is_held_to_its_budget(database, clock, tmp_path, monkeypatch):
    from runtime import Budget

    monkeypatch.setattr(pai_agents, "DIR", tmp_path)
    with registry.override(pai_agents.build(budget=Budget(max_tokens=60))):
        run = resume(start("pai-refunds", "refund A-17", clock=clock).pk, clock=clock)
    assert (run.status, run.failure_code) == ("failed", "budget_exceeded")
    assert "tokens exceed the budget of 60" in run.failure_message
    with registry.override(pai_agents.build(budget=Budget(max_steps=2))):
        run = resume(start("pai-refunds", "refund A-17", clock=clock).pk, clock=clock)
    assert (run.status, run.failure_code) == ("failed", "budget_exceeded")
    assert pai_agents.ledger().count("send_note") == 0


def test_a_crash_between_a_calls_record_and_its_pause_asks_again(database, clock, crash,
                                                                 tmp_path, monkeypatch):
    """A read-only call the agent wants approved: the process dies after the step's record,
    before its approval is written. The next owner decides the call again: it still waits
    for a person, and nothing ran."""
    monkeypatch.setattr(pai_agents, "DIR", tmp_path)
    with registry.override(pai_agents.build_gated(effects={"wire_money": "read_only"})):
        run = crash_then_take_over(start("pai-gated", "wire it", clock=clock).pk, clock,
                                   crash, CrashPoint.AFTER_STEP_DECIDED, 1)
    assert run.status == "waiting"
    (held,) = pending().filter(run_id=run.pk)
    assert (held.kind, held.tool) == ("policy", "wire_money")
    assert pai_agents.ledger().count("wire_money") == 0
    assert verify(run.pk).ok


def test_tool_call_ids_reused_across_responses_are_told_apart(database, clock, crash, tmp_path,
                                                               monkeypatch):
    """Some providers number calls per response (``call_0`` in each): a resumed run still
    gives each recorded call its own result."""
    monkeypatch.setattr(pai_agents, "DIR", tmp_path)
    desk = pai_agents.build(name="pai-reused")

    def reuse(messages, info):
        response = pai_agents.refund_desk_model(messages, info)
        for n, part in enumerate(p for p in response.parts if hasattr(p, "tool_call_id")):
            part.tool_call_id = f"call_{n}"
        return response

    with registry.override(desk), desk.pydantic_agent.override(model=FunctionModel(reuse)):
        run = crash_then_take_over(start("pai-reused", "refund A-17", clock=clock).pk, clock,
                                   crash, CrashPoint.AFTER_TOOL_FINISHED, 2)
    assert run.status == "succeeded", run.failure_message
    assert [s.tool for s in Step.objects.filter(run=run).order_by("index")] == [
        "lookup_order", "refund", "send_note"]
    ledger = pai_agents.ledger()
    assert (ledger.count("lookup_order"), ledger.count("refund"),
            ledger.count("send_note")) == (1, 1, 1)


def test_the_in_process_kit_crashes_a_pydantic_ai_agent_and_checks_the_invariants(
        database, tmp_path, monkeypatch):
    """``InProcessKit`` with the matrix's Pydantic AI agents: a crash at every point around the
    step-2 call, the operator running each held call once more, every invariant checked
    against the outside world's ledger."""
    from runtime.testkit import APPROVE, Crash, InProcessKit
    from runtime.testkit import pai_agents as kit_agents
    from runtime.testkit.ledger import Ledger

    monkeypatch.setenv("RUNTIME_TEST_DIR", str(tmp_path))
    points = [CrashPoint.AFTER_STEP_STARTED, CrashPoint.AFTER_STEP_DECIDED,
              CrashPoint.AFTER_TOOL_STARTED, CrashPoint.AFTER_TOOL_EFFECT,
              CrashPoint.AFTER_TOOL_FINISHED, CrashPoint.DURING_LLM_REQUEST]
    with registry.override(*kit_agents.AGENTS):
        kit = InProcessKit(Ledger(tmp_path / "ledger.jsonl"))
        runs = {(kind, point): kit.start(kind, {"point": str(point)})
                for kind in kit_agents.KINDS for point in points}
        for (_kind, point), run_id in runs.items():
            kit.crash(run_id, Crash(point, step_index=2))
        kit.expire()
        kit.drain()
        for approval in Approval.objects.filter(status="pending"):
            kit.decide(approval.pk, APPROVE)
        finished = kit.drain()
        kit.check()
    assert {r.status for r in finished} <= {"succeeded"}
    assert set(Run.objects.values_list("status", flat=True)) == {"succeeded"}
    executions = kit.ledger.executions()
    for (kind, point), run_id in runs.items():
        # Once, except where the call took effect and its outcome was lost: a read is made
        # again; a side effect ran again only because a person allowed it.
        expected = 2 if point == CrashPoint.AFTER_TOOL_EFFECT else 1
        assert executions[(run_id, 2)] == expected, (kind, point)
