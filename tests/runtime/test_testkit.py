"""runtime.testkit: the reference's named scenarios with real SIGKILLs, the same-host instant
takeover, double crashes, each invariant caught when broken, and the in-process kit giving the
same outcomes as the process matrix."""

from __future__ import annotations

import pytest
from django.db import connection

from runtime import (
    Agent,
    Budget,
    FinalAnswer,
    LLMError,
    LLMResponse,
    RequireApproval,
    ScriptedLLM,
    ToolCall,
    Usage,
    cancel,
)
from runtime.agents.agent import registry
from runtime.loop.driver import Driver
from runtime.models import Approval, ApprovalStatus, Event, Run, Step
from runtime.testkit import (
    APPROVE,
    Crash,
    CrashNotReached,
    CrashPoint,
    InProcessKit,
    InvariantViolation,
    Ledger,
    ProcessKit,
    Reached,
    check_invariants,
)
from runtime.testkit import agents as kit_agents
from tests.procs import ROOT
from tests.runtime.test_crash_matrix import BRANCHES, SCHEDULED, observe, plan

P = CrashPoint
AGENTS = "runtime.testkit.agents.AGENTS"

pytestmark = pytest.mark.engines


@pytest.fixture
def kit(database, tmp_path) -> ProcessKit:
    return ProcessKit(database, tmp_path, agents=AGENTS, manage=ROOT / "manage.py", lease_seconds=2,
                      env={"RUNTIME_TEST_DIR": str(tmp_path)})


@pytest.fixture
def mem(database, tmp_path, monkeypatch):
    monkeypatch.setenv("RUNTIME_TEST_DIR", str(tmp_path))
    with registry.override(*kit_agents.AGENTS):
        yield InProcessKit(Ledger(tmp_path / "ledger.jsonl"))


def pending(run_id: int) -> Approval:
    return Approval.objects.get(run_id=run_id, status=ApprovalStatus.PENDING)


def charges(kit, run_id: int) -> int:
    return kit.ledger.executions()[(run_id, 2)]


# -- the reference's named scenarios, with real processes ----------------------------------------


@pytest.mark.slow
def test_side_effect_lost_to_a_crash_runs_again_only_when_approved(kit):
    kit.lease_seconds = 10  # room for a fresh process to start and be refused, even under load
    run = kit.start("charge")
    kit.crash(run, Crash(P.AFTER_TOOL_STARTED, step_index=2))
    refused = kit.resume(run)  # a fresh process, while the dead owner's lease is live
    assert refused.returncode == 1 and "is leased by" in refused.output
    kit.wait_for_expiry()
    assert kit.resume(run).returncode == 3  # waiting for a person
    assert charges(kit, run) == 0 and pending(run).kind == "interrupted_side_effect"
    assert kit.resume(run).returncode == 1  # nobody decided: it stays put
    assert charges(kit, run) == 0
    kit.decide(pending(run).pk, APPROVE)
    assert kit.resume(run).returncode == 0
    assert charges(kit, run) == 1 and Run.objects.get(pk=run).status == "succeeded"
    kit.check()


@pytest.mark.slow
def test_approved_request_survives_a_crash_after_resume(kit):
    run = kit.start("charge")
    kit.crash(run, Crash(P.AFTER_TOOL_EFFECT, step_index=2))
    kit.wait_for_expiry()
    assert kit.resume(run).returncode == 3
    approval = pending(run)
    kit.decide(approval.pk, APPROVE)
    kit.crash(run, Crash(P.AFTER_RUN_RESUMED))  # the process that would consume it dies first
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED  # not consumed: the grant survives
    kit.wait_for_expiry()
    assert kit.resume(run).returncode == 0
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.CONSUMED
    assert charges(kit, run) == 2  # the first (unknown) call and the one approved re-run
    assert Event.objects.filter(run_id=run, kind="approval.consumed").count() == 1
    kit.check()


@pytest.mark.slow
def test_crash_after_takeover_still_waits_for_the_operator(kit):
    run = kit.start("charge")
    kit.crash(run, Crash(P.AFTER_TOOL_STARTED, step_index=2))
    kit.wait_for_expiry()
    kit.crash(run, Crash(P.AFTER_STEP_INTERRUPTED, step_index=2))
    kit.wait_for_expiry()
    assert kit.resume(run).returncode == 3
    assert charges(kit, run) == 0 and pending(run).kind == "interrupted_side_effect"
    assert Event.objects.filter(run_id=run, kind="lease.taken_over").count() == 2
    kit.check()


@pytest.mark.slow
def test_a_crash_after_an_approval_is_consumed_asks_again(kit):
    run = kit.start("charge")
    kit.crash(run, Crash(P.AFTER_TOOL_STARTED, step_index=2))
    kit.wait_for_expiry()
    kit.resume(run)
    first = pending(run)
    kit.decide(first.pk, APPROVE)
    kit.crash(run, Crash(P.AFTER_TOOL_EFFECT, step_index=2))  # the approved re-run dies too
    kit.wait_for_expiry()
    assert kit.resume(run).returncode == 3
    second = pending(run)
    assert second.pk != first.pk and second.kind == "interrupted_side_effect"
    first.refresh_from_db()
    assert first.status == ApprovalStatus.CONSUMED
    assert charges(kit, run) == 1  # never a silent re-run
    kit.check()


@pytest.mark.slow
def test_same_host_takeover_is_instant(kit):
    kit.lease_seconds = 60  # waiting this out would fail the test's timeout
    run = kit.start("charge")
    kit.crash_worker(Crash(P.AFTER_TOOL_STARTED, step_index=2))
    held = Run.objects.get(pk=run)
    assert held.status == "running" and kit.refused(run)
    kit.drain(expiry=False)
    taken = Event.objects.get(run_id=run, kind="lease.taken_over")
    assert taken.payload["reason"] == "owner proved dead"
    assert taken.at < held.lease_expires_at
    assert pending(run).kind == "interrupted_side_effect"
    kit.check()


@pytest.mark.slow
def test_a_crash_that_is_never_reached_fails(kit):
    run = kit.start("charge")  # charge never dispatches
    with pytest.raises(CrashNotReached) as info:
        kit.crash(run, Crash(P.AFTER_TOOL_DISPATCHED, step_index=2))
    assert info.value.run_id == run and info.value.point == "after_tool_dispatched"
    with pytest.raises(InvariantViolation, match=r"invariant 5.*never reached"):
        kit.check()


# -- the invariants catch what they claim to catch ------------------------------------------------


def test_a_side_effect_seen_twice_outside_without_approval_is_caught(mem):
    run = mem.start("charge")
    mem.drain()
    mem.check()
    mem.ledger.record("charge", run=run, step=2, attempt=1, key="again")  # the world saw 2
    with pytest.raises(InvariantViolation) as info:
        mem.check()
    [v] = info.value.violations
    assert (v.invariant, v.run_id, v.step_index) == (1, run, 2)
    assert "took effect 2 times" in str(v)


def test_an_approval_whose_row_disagrees_with_its_consumption_is_caught(mem):
    run = mem.start("charge")
    mem.crash(run, Crash(P.AFTER_TOOL_STARTED, step_index=2))
    mem.take_over(run)
    mem.decide(pending(run).pk, APPROVE)
    mem.drain()
    mem.check()
    Approval.objects.filter(run_id=run).update(status=ApprovalStatus.APPROVED)
    with pytest.raises(InvariantViolation, match=r"invariant 2: run \d+ step 2: approval \d+ is "
                                                 r"approved but its consumption was recorded 1"):
        mem.check()


def test_a_started_call_left_in_flight_in_a_quiet_run_is_caught(mem):
    run = mem.start("charge")
    mem.crash(run, Crash(P.AFTER_TOOL_STARTED, step_index=2))
    Run.objects.filter(pk=run).update(status="failed", lease_owner="")  # no events: a bug
    with pytest.raises(InvariantViolation) as info:
        mem.check()
    found = {(v.invariant, v.step_index) for v in info.value.violations}
    assert {(3, 2), (4, 2), (6, None)} <= found
    started = Event.objects.get(run_id=run, step_index=2, kind="step.tool_started")
    assert any(started.seq in v.events for v in info.value.violations if v.invariant == 3)


def test_a_running_run_without_a_live_lease_is_caught(mem):
    run = mem.start("charge")
    mem.crash(run, Crash(P.AFTER_STEP_STARTED, step_index=2))
    mem.expire()
    with pytest.raises(InvariantViolation, match=r"invariant 4: run \d+: running without a live"):
        mem.check()


def test_a_broken_chain_or_a_state_the_events_do_not_give_is_caught(mem):
    run = mem.start("read")
    mem.drain()
    mem.check()
    Step.objects.filter(run_id=run, index=2).update(attempt=5)
    with pytest.raises(InvariantViolation, match=r"invariant 6: run \d+: .*step 2: attempt is "
                                                 r"5 in the row; the events give 1"):
        mem.check()
    Step.objects.filter(run_id=run, index=2).update(attempt=1)
    with connection.cursor() as cur:  # the append-only trigger, as each engine names it
        cur.execute("DROP TRIGGER runtime_event_no_update" if connection.vendor == "sqlite"
                    else "DROP TRIGGER runtime_event_no_update_delete ON runtime_event")
        cur.execute("UPDATE runtime_event SET actor = 'someone else' WHERE run_id = %s AND "
                    "seq = 3", [run])
    with pytest.raises(InvariantViolation, match=r"invariant 6.*hash mismatch"):
        mem.check()


def test_reached_bookkeeping_matches_point_step_and_run():
    reached = Reached()
    reached.expect(1, Crash(P.AFTER_TOOL_STARTED, step_index=2))
    reached.expect(2, Crash(P.AFTER_PAUSE))
    reached.hit(1, "after_tool_started", 3)  # wrong step
    reached.hit(2, "after_pause", 7)
    assert [(m.point, m.run_id, m.step_index) for m in reached.missing()] == [
        ("after_tool_started", 1, 2)]
    with pytest.raises(InvariantViolation, match="invariant 5"):
        check_invariants(executions={}, reached=reached, runs=[])


# -- the in-process kit: the matrix's outcomes, without subprocesses -----------------------------


def test_the_in_process_kit_gives_the_process_matrix_outcomes(mem):
    """Every cell of the process matrix, replayed in-process: same outcome, same executions."""
    cells = plan()
    runs = {}
    for cell in cells:
        for branch in ["none", "approve"] if cell.waits else ["none"]:
            run = (mem.start_scheduled if cell.kind in SCHEDULED else mem.start)(cell.kind)
            mem.crash(run, cell.phases[0])
            for crash in cell.phases[1:]:
                mem.expire()
                mem.crash(run, crash)
            runs[run] = (cell, branch)
    mem.drain()
    ledger = mem.ledger.executions()
    for run, (cell, _) in runs.items():
        assert observe(run, ledger) == (cell.outcome, cell.executions), (cell.point, cell.kind)
    mem.check()
    for run, (_, branch) in runs.items():
        if branch != "none":
            mem.decide(pending(run).pk, BRANCHES[branch])
    mem.drain()
    ledger = mem.ledger.executions()
    for run, (cell, branch) in runs.items():
        if branch == "approve":
            assert Run.objects.get(pk=run).status == "succeeded"
            assert ledger[(run, 2)] == cell.executions + 1
    report = mem.check()
    assert report.approvals_consumed == sum(b == "approve" for _, b in runs.values())


# -- paths where the record and the rows must still agree (each checked by every invariant) ---


class _FlakyLLM:
    """Fails ``fails`` times (retryable or not), then answers."""

    def __init__(self, fails: int, retryable: bool = True) -> None:
        self.left, self.retryable, self.max_retries = fails, retryable, 3

    def complete(self, transcript, tools):
        if self.left > 0:
            self.left -= 1
            raise LLMError("the model is overloaded", retryable=self.retryable, retry_after=0)
        return LLMResponse([FinalAnswer({"ok": True})], Usage(tokens_in=3, tokens_out=2))


def _checked_run(mem, agent, *, crash: Crash | None = None, decide=None) -> Run:
    with registry.override(agent):
        run = mem.start(agent.name)
        if crash is not None:
            mem.crash(run, crash)
        mem.drain()
        if decide is not None:
            mem.operate(decide)
            mem.drain()
    mem.check()
    return Run.objects.get(pk=run)


def test_a_retried_llm_request_replays_to_the_same_state(mem):
    run = _checked_run(mem, Agent("flaky", _FlakyLLM(1), []))
    assert run.status == "succeeded" and run.llm_requests == 1
    assert Event.objects.filter(run_id=run.pk, kind="llm.requested").count() == 2


def test_a_step_decided_again_after_a_takeover_is_on_the_record(mem):
    out_of_budget = Agent("tight", ScriptedLLM([FinalAnswer(1)]), [],
                          budget=Budget(max_llm_requests=1))
    run = _checked_run(mem, out_of_budget, crash=Crash(P.DURING_LLM_REQUEST, step_index=1))
    assert (run.status, run.failure_code) == ("failed", "budget_exceeded")
    assert Step.objects.get(run_id=run.pk).status == "failed"
    llm_down = Agent("down", _FlakyLLM(99, retryable=False), [])
    run = _checked_run(mem, llm_down, crash=Crash(P.DURING_LLM_REQUEST, step_index=1))
    assert run.failure_code == "error"
    assert Event.objects.filter(run_id=run.pk, kind="step.started").count() == 2


def test_a_policy_that_raises_on_an_approved_request_cancels_the_approval(mem):
    asked = []

    def policy(request, run):
        asked.append(request.tool)
        if len(asked) == 1:
            return RequireApproval("Charge?")
        raise RuntimeError("the policy service is down")

    agent = Agent("gated", ScriptedLLM([ToolCall("charge", {"amount": 1})]),
                  kit_agents.TOOLS, policy=policy)
    run = _checked_run(mem, agent, decide=lambda approval: APPROVE)
    assert (run.status, run.failure_code) == ("failed", "error")
    assert Approval.objects.get(run_id=run.pk).status == "cancelled"
    assert mem.ledger.count("charge") == 0


def test_cancelling_a_run_released_mid_decision_ends_its_step(mem):
    agent = Agent("released", ScriptedLLM([FinalAnswer(1)]), [])
    with registry.override(agent):
        run = mem.start("released")
        driver = Driver("w@h:1:x", clock=mem.clock)
        stopping = iter([False, True])  # the worker is asked to stop before the LLM request
        driver.execute(driver.acquire(run), should_stop=lambda: next(stopping, True))
        assert Run.objects.get(pk=run).status == "queued"
        assert Step.objects.get(run_id=run).status == "deciding"
        cancel(run, "olga", "not needed", clock=mem.clock)
    mem.check()
    assert Step.objects.get(run_id=run).status == "interrupted"


@pytest.mark.parametrize("kind", ["charge", "read"])
def test_a_crash_inside_the_takeover_transaction_leaves_the_run_to_the_next_owner(mem, kind):
    """The takeover (lease, run.resumed, step.interrupted) is one transaction: dying inside
    it before the commit stores none of it, and the next owner applies the contract once."""
    with registry.override(*kit_agents.AGENTS):
        run = mem.start(kind)
        mem.crash(run, Crash(P.AFTER_TOOL_STARTED, step_index=2))
        mem.expire()
        before = Event.objects.filter(run_id=run).count()
        mem.crash(run, Crash(P.IN_TRANSACTION, step_index=2))  # inside the takeover
        assert Event.objects.filter(run_id=run).count() == before  # nothing of it stored
        assert Step.objects.get(run_id=run, index=2).status == "executing"
        mem.drain()
    mem.check()
    assert Event.objects.filter(run_id=run, kind="step.interrupted").count() == 1
    status = Run.objects.get(pk=run).status
    assert status == ("waiting" if kind == "charge" else "succeeded")
    assert mem.ledger.executions()[(run, 2)] == (0 if kind == "charge" else 1)
