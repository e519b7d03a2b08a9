"""The loop (design §5): commits per step, budgets, and every bad input ending in a clear record."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection

from runtime import (
    Budget,
    FinalAnswer,
    InvalidPayload,
    LLMResponse,
    ScriptedLLM,
    ToolCall,
    UnknownAgent,
    Usage,
    cancel,
    resume,
    start,
    tool,
)
from runtime.agents.agent import Agent, registry
from runtime.audit.chain import verify
from runtime.crashpoints import CrashPoint
from runtime.errors import RunNotResumable, SimulatedCrash
from runtime.leasing.heartbeat import LeaseKeeper
from runtime.loop.driver import Driver
from runtime.models import Event, Run, Step
from runtime.storage.postgres.instrument import PgTrace
from runtime.storage.postgres.network import DEFAULT_POOL_SIZE
from runtime.storage.postgres.pool import connection_pool_start
from runtime.storage.protocol import protocol_check
from runtime.storage.sqlite.instrument import SqliteCounter
from tests.kit import Ledger, events_of, make_agent

pytestmark = pytest.mark.engines


def _drive(run_id: int) -> tuple[Run, SqliteCounter | PgTrace]:
    """Drive the run on this thread, counting what the database executed as the engine itself
    reports it (SQLite's trace callback, libpq's protocol trace)."""
    driver = Driver(name="t", lease_seconds=30, keeper=LeaseKeeper(30))  # no heartbeat thread
    with SqliteCounter() if connection.vendor == "sqlite" else PgTrace() as counter:
        run = driver.drive(run_id)
    return run, counter


def _count(tmp_path, name: str, call: ToolCall, steps: int) -> SqliteCounter | PgTrace:
    agent = make_agent(name, [call] * steps + [FinalAnswer("ok")], Ledger(tmp_path / name),
                       budget=Budget(max_steps=10_000, max_llm_requests=10_000))
    with registry.override(agent):
        run, counter = _drive(start(name, {}).pk)
    assert run.status == "succeeded"
    assert Step.objects.filter(run_id=run.pk).count() == steps + 1
    return counter


# Synced commits are counted by SQLite's trace callback (runtime.storage.sqlite.instrument):
# SQLite alone.
@pytest.mark.engines("sqlite")
@pytest.mark.parametrize(("call", "per_step"), [
    (ToolCall("read", {"key": "k"}), 2),
    (ToolCall("charge", {"amount": 1}), 2),
    (ToolCall("send", {"to": "x"}), 3),  # + step.tool_dispatched, committed before the send
])
def test_synced_commits_per_step_in_the_steady_state(database, tmp_path, call, per_step):
    short = _count(tmp_path, f"{call.tool}5", call, 5)
    long = _count(tmp_path, f"{call.tool}15", call, 15)
    assert (long.commits - short.commits) / 10 == per_step
    assert long.rollbacks == 0


def test_statements_per_step_do_not_grow_with_the_run(database, tmp_path):
    protocol_check()  # once per process: not a cost of the first run counted
    a = _count(tmp_path, "s10", ToolCall("read", {"key": "k"}), 10)
    b = _count(tmp_path, "s20", ToolCall("read", {"key": "k"}), 20)
    c = _count(tmp_path, "s120", ToolCall("read", {"key": "k"}), 120)
    assert (b.statements - a.statements) / 10 == (c.statements - b.statements) / 100


def test_a_run_records_every_event_of_the_loop_in_order(database, tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    agent = make_agent("order", [ToolCall("charge", {"amount": 7}), FinalAnswer({"done": 1})],
                       ledger)
    with registry.override(agent):
        run = resume(start("order", {"x": 1}, created_by="ada").pk, lease_seconds=30)
    assert events_of(run) == [
        "run.created", "lease.taken", "run.started",
        "step.started", "llm.requested",
        "llm.responded", "step.decided", "step.tool_started",
        "step.tool_finished", "step.started", "llm.requested",
        "llm.responded", "step.decided", "run.succeeded", "lease.released",
    ]
    assert run.output == {"done": 1} and run.created_by == "ada"
    assert run.lease_owner == "" and run.lease_expires_at is None
    step = Step.objects.get(run_id=run.pk, index=1)
    assert (step.tool, step.arguments, step.effect, step.result, step.attempt) == (
        "charge", {"amount": 7}, "side_effect", {"charged": 7}, 1)
    assert ledger.calls("charge")[0]["key"] == step.idempotency_key
    assert verify(run).ok


def test_totals_are_charged_from_each_llm_response(database, tmp_path):
    usage = Usage(tokens_in=100, tokens_out=20, cost=Decimal("0.0015"))
    llm = ScriptedLLM([ToolCall("read", {"key": "a"}), FinalAnswer("ok")], usage=usage)
    agent = make_agent("tot", [], Ledger(tmp_path / "l"), llm=llm)
    with registry.override(agent):
        run = resume(start("tot", {}).pk)
    assert (run.llm_requests, run.tokens_in, run.tokens_out) == (2, 200, 40)
    assert run.cost == Decimal("0.003")


def test_several_tool_calls_in_one_response_become_consecutive_steps(database, tmp_path):
    ledger = Ledger(tmp_path / "l")
    llm = ScriptedLLM([[ToolCall("read", {"key": "a"}), ToolCall("read", {"key": "b"})],
                       FinalAnswer("ok")])
    agent = make_agent("multi", [], ledger, llm=llm)
    with registry.override(agent):
        run = resume(start("multi", {}).pk)
    assert run.status == "succeeded"
    assert [c["key"] for c in ledger.calls("read")] == ["a", "b"]
    assert llm.calls == 2
    assert events_of(run).count("llm.requested") == 2


def test_planned_calls_survive_a_crash(database, tmp_path, crash, clock):
    ledger = Ledger(tmp_path / "l")
    llm = ScriptedLLM([[ToolCall("read", {"key": "a"}), ToolCall("read", {"key": "b"})],
                       FinalAnswer("ok")])
    agent = make_agent("plan", [], ledger, llm=llm)
    with registry.override(agent):
        run = start("plan", {})
        crash(CrashPoint.AFTER_TOOL_FINISHED, step_index=1)
        with pytest.raises(SimulatedCrash):
            resume(run.pk, clock=clock, lease_seconds=1)
        assert Run.objects.get(pk=run.pk).planned == [{"tool": "read", "arguments": {"key": "b"}}]
        clock.advance(2)
        run = resume(run.pk, clock=clock, lease_seconds=1)
    assert run.status == "succeeded"
    assert [c["key"] for c in ledger.calls("read")] == ["a", "b"]
    assert llm.calls == 2  # step 2 came from the first response, not a new request


@pytest.mark.parametrize(("budget", "expect"), [
    (Budget(max_steps=2), "budget of 2 steps"),
    (Budget(max_llm_requests=2), "budget of 2"),
    (Budget(max_tokens=25), "exceed the budget of 25"),
    (Budget(max_cost=Decimal("0.01")), "exceeds the budget of 0.01"),
])
def test_budgets_fail_the_run(database, tmp_path, budget, expect):
    ledger = Ledger(tmp_path / "l")
    llm = ScriptedLLM([ToolCall("read", {"key": str(i)}) for i in range(10)],
                      usage=Usage(10, 5, Decimal("0.006")))
    agent = make_agent("budget", [], ledger, llm=llm, budget=budget)
    with registry.override(agent):
        run = resume(start("budget", {}).pk)
    assert run.status == "failed" and run.failure_code == "budget_exceeded"
    assert expect in run.failure_message
    assert ledger.count("read") < 10
    assert not Step.objects.filter(run_id=run.pk, status__in=["deciding", "executing"]).exists()
    assert verify(run).ok


def _errors_seen_by_llm(transcript):
    if transcript.entries and transcript.entries[-1].error:
        return FinalAnswer({"saw": transcript.entries[-1].error})
    return None


@pytest.mark.parametrize(("call", "message"), [
    (ToolCall("launch_rockets", {}), "has no tool 'launch_rockets'"),
    (ToolCall("charge", {"amount": "lots"}), "amount: Input should be a valid integer"),
    (ToolCall("charge", {"amount": 1, "currency": "EUR"}), "currency: Extra inputs"),
    (ToolCall("charge", {}), "amount: Field required"),
])
def test_bad_decisions_are_recorded_as_failed_steps_and_shown_to_the_llm(database, tmp_path, call,
                                                                        message):
    ledger = Ledger(tmp_path / "l")
    llm = ScriptedLLM(lambda t: _errors_seen_by_llm(t) or call)
    agent = make_agent("bad", [], ledger, llm=llm)
    with registry.override(agent):
        run = resume(start("bad", {}).pk)
    assert ledger.count() == 0
    step = Step.objects.get(run_id=run.pk, index=1)
    assert step.status == "failed" and message in step.error
    failed = Event.objects.get(run_id=run.pk, kind="step.tool_failed")
    assert failed.payload["started"] is False
    assert "step.tool_started" not in events_of(run)
    assert run.status == "succeeded" and message in run.output["saw"]


def test_tool_results_that_cannot_be_stored_fail_the_step_cleanly(database, tmp_path, settings):
    settings.RUNTIME = {**settings.RUNTIME, "MAX_PAYLOAD_BYTES": 200}

    @tool(effect="read_only")
    def odd(kind: str) -> object:
        """Return something awkward."""
        return {"set": {1, 2}} if kind == "set" else {"blob": "x" * 500}

    script = [ToolCall("odd", {"kind": "set"}), ToolCall("odd", {"kind": "big"}),
              FinalAnswer("ok")]
    with registry.override(Agent("odd", ScriptedLLM(script), [odd])):
        run = resume(start("odd", {}).pk)
    errors = list(Step.objects.filter(run_id=run.pk, status="failed").order_by("index")
                  .values_list("error", flat=True))
    assert "not JSON-serialisable" in errors[0]
    assert "larger than the limit of 200 bytes" in errors[1]
    assert run.status == "succeeded"


def test_a_tool_that_raises_fails_its_step_and_the_run_goes_on(database, tmp_path):
    @tool(effect="read_only")
    def flaky() -> str:
        """Always fails."""
        raise ConnectionError("upstream said no")

    llm = ScriptedLLM(lambda t: _errors_seen_by_llm(t) or ToolCall("flaky"))
    with registry.override(Agent("flaky", llm, [flaky])):
        run = resume(start("flaky", {}).pk)
    event = Event.objects.get(run_id=run.pk, kind="step.tool_failed")
    assert event.payload == {"error": "ConnectionError: upstream said no", "attempt": 1,
                             "started": True}
    assert run.output == {"saw": "ConnectionError: upstream said no"}


@pytest.mark.parametrize("llm", [
    ScriptedLLM(lambda t: (_ for _ in ()).throw(TimeoutError("no answer"))),
    ScriptedLLM(lambda t: LLMResponse([])),
    ScriptedLLM(lambda t: LLMResponse([ToolCall("read", {"key": object()})])),
])
def test_a_failed_llm_request_is_recorded_and_fails_the_run(database, tmp_path, llm):
    with registry.override(make_agent("llmfail", [], Ledger(tmp_path / "l"), llm=llm)):
        run = resume(start("llmfail", {}).pk)
    assert run.status == "failed" and run.failure_code == "error"
    assert "LLM request failed" in run.failure_message
    kinds = events_of(run)
    assert kinds[-4:] == ["llm.requested", "llm.failed", "run.failed", "lease.released"]
    assert verify(run).ok


def test_a_final_answer_that_cannot_be_stored_fails_the_run(database, tmp_path):
    llm = ScriptedLLM([FinalAnswer({"when": object()})])
    with registry.override(make_agent("finalbad", [], Ledger(tmp_path / "l"), llm=llm)):
        run = resume(start("finalbad", {}).pk)
    assert run.status == "failed" and "final answer: not JSON-serialisable" in run.failure_message


def test_bad_input_and_unknown_agents_write_nothing(database, tmp_path, settings):
    settings.RUNTIME = {**settings.RUNTIME, "MAX_PAYLOAD_BYTES": 100}
    with registry.override(make_agent("in", [FinalAnswer(1)], Ledger(tmp_path / "l"))):
        with pytest.raises(UnknownAgent, match="unknown agent 'nope'"):
            start("nope", {})
        with pytest.raises(InvalidPayload, match="not JSON-serialisable"):
            start("in", {"x": {1, 2}})
        with pytest.raises(InvalidPayload, match="larger than the limit"):
            start("in", {"x": "y" * 200})
    assert Run.objects.count() == 0 and Event.objects.count() == 0


def test_an_agent_that_disappeared_fails_its_run_clearly(database, tmp_path):
    with registry.override(make_agent("gone", [FinalAnswer(1)], Ledger(tmp_path / "l"))):
        run = start("gone", {})
    run = resume(run.pk)
    assert run.status == "failed" and "unknown agent 'gone'" in run.failure_message


def test_cancel_ends_a_queued_run_and_refuses_a_finished_one(database, tmp_path):
    with registry.override(make_agent("c", [FinalAnswer(1)], Ledger(tmp_path / "l"))):
        queued, done = start("c", {}), start("c", {})
        resume(done.pk)
    assert cancel(queued.pk, by="ada", reason="not needed").status == "cancelled"
    assert events_of(queued)[-1] == "run.cancelled"
    with pytest.raises(RunNotResumable):
        cancel(done.pk, by="ada")
    with pytest.raises(RunNotResumable):
        resume(queued.pk)
    assert verify(queued.pk).ok


@pytest.mark.parametrize("value", [None, 0, "", [], "text", {"a": None}])
def test_any_json_value_is_a_valid_input_including_null(database, tmp_path, value):
    agent = make_agent("echo", [FinalAnswer("done")], Ledger(tmp_path / "ledger"))
    with registry.override(agent):
        run = start("echo", value)
        assert run.input == value
        run = resume(run.pk)
    assert run.status == "succeeded" and Run.objects.get(pk=run.pk).input == value
    created = Event.objects.get(run_id=run.pk, kind="run.created")
    assert created.payload["input"] == value and verify(run).ok


def test_a_run_holds_no_pooled_connection_while_it_waits_on_the_llm_or_a_tool(database):
    """Where a pool lends connections (a worker's, on PostgreSQL), a run gives its own back
    before each outside call, so runs in flight need not fit in the server's connections;
    without a pool (SQLite) the thread keeps its connection."""
    assert "pool" not in connection.settings_dict["OPTIONS"]  # the console's: one per request
    connection_pool_start(DEFAULT_POOL_SIZE + 1)  # a worker with more threads than connections
    pooled = bool(connection.settings_dict["OPTIONS"].get("pool"))
    assert pooled == (connection.vendor == "postgresql")
    held: list[tuple[str, bool]] = []

    def llm(transcript):
        held.append(("llm", connection.connection is not None))
        return FinalAnswer("ok") if transcript.entries else ToolCall("look", {})

    @tool(effect="read_only")
    def look(ctx) -> dict:
        held.append(("tool", connection.connection is not None))
        return {}

    with registry.override(Agent("waits", ScriptedLLM(llm), [look])):
        run, _counter = _drive(start("waits", {}).pk)
    assert run.status == "succeeded"
    assert held == [("llm", not pooled), ("tool", not pooled), ("llm", not pooled)]
