"""Async agents: ``async def`` tools, ``ctx.dispatch()`` from them, and async model clients
(``AsyncOpenAIChat`` or any ``async def complete``), under the same interruption contract as
sync ones. Side-effect counts come from the Ledger."""

from __future__ import annotations

import asyncio
import json
from functools import partial

import httpx
import pytest

from runtime import (
    Agent,
    AsyncOpenAIChat,
    FinalAnswer,
    LLMResponse,
    ScriptedLLM,
    ToolCall,
    ToolContext,
    resume,
    start,
    tool,
)
from runtime.agents.agent import registry
from runtime.approvals.decisions import approve
from runtime.audit.chain import verify
from runtime.crashpoints import CrashPoint
from runtime.models import Run
from runtime.selectors.approvals import pending
from tests import agents
from tests.kit import Ledger, crash_then_take_over, events, events_of, make_tools

pytestmark = pytest.mark.engines

SCRIPT = [ToolCall("read", {"key": "k"}), ToolCall("charge", {"amount": 5}),
          ToolCall("send", {"to": "ann"}), FinalAnswer("done")]


def async_tools(ledger: Ledger, *, awaited_dispatch: bool = False) -> list:
    """read, charge and send as ``async def`` tools (each awaits, as a network call would);
    ``awaited_dispatch``: send announces its call with ``await ctx.adispatch()``."""

    @tool(effect="read_only")
    async def read(ctx: ToolContext, key: str) -> dict:
        """Look something up."""
        await asyncio.sleep(0)
        ledger.record("read", key=key, attempt=ctx.attempt, step=ctx.step_index, run=ctx.run_id)
        return {"value": key.upper()}

    @tool(effect="side_effect")
    async def charge(ctx: ToolContext, amount: int) -> dict:
        """Charge a card."""
        await asyncio.sleep(0)
        ledger.record_call("charge", ctx, amount=amount)
        return {"charged": amount}

    @tool(effect="side_effect", dispatches=True)
    async def send(ctx: ToolContext, to: str) -> dict:
        """Send a message; announces the outbound call with ctx.dispatch()."""
        await asyncio.sleep(0)
        if awaited_dispatch:
            await ctx.adispatch()
        else:
            ctx.dispatch()
        ledger.record_call("send", ctx, to=to)
        return {"sent": to}

    return [read, charge, send]


class AsyncScripted:
    """An async model client: ``ScriptedLLM``'s answers from a coroutine."""

    def __init__(self, script: list) -> None:
        self.script = ScriptedLLM(script)

    async def complete(self, transcript, tools) -> LLMResponse:
        await asyncio.sleep(0)
        return self.script.complete(transcript, tools)


def test_an_async_agent_runs_like_a_sync_one(database, tmp_path, clock):
    ledgers = {kind: Ledger(tmp_path / f"{kind}.jsonl") for kind in ("sync", "async")}
    agents = [Agent("sync", ScriptedLLM(SCRIPT), make_tools(ledgers["sync"])),
              Agent("async", AsyncScripted(SCRIPT), async_tools(ledgers["async"]))]
    with registry.override(*agents):
        runs = {a.name: resume(start(a.name, {}, clock=clock).pk, clock=clock) for a in agents}
    assert {name: r.status for name, r in runs.items()} == {"sync": "succeeded",
                                                            "async": "succeeded"}
    assert events_of(runs["async"]) == events_of(runs["sync"])
    assert [c["call"] for c in ledgers["async"].calls()] == ["read", "charge", "send"]
    assert verify(runs["async"].pk).ok


@pytest.mark.parametrize("point,index", [
    (CrashPoint.AFTER_TOOL_STARTED, 2), (CrashPoint.AFTER_TOOL_EFFECT, 2),
    (CrashPoint.AFTER_TOOL_STARTED, 3), (CrashPoint.AFTER_TOOL_DISPATCHED, 3),
    (CrashPoint.AFTER_TOOL_EFFECT, 3), (CrashPoint.AFTER_TOOL_EFFECT, 1)])
def test_a_crash_in_an_async_tool_is_settled_as_in_a_sync_one(database, tmp_path, clock, crash,
                                                               point, index):
    """Every crash point around a call: the same outcome and the same count in the outside
    world's ledger for the async tool as for its sync twin; ``ctx.dispatch()`` from the async
    tool proves non-dispatch as before."""
    outcome = {}
    for kind, tools_of in (("sync", make_tools), ("async", async_tools),
                           ("adispatch", partial(async_tools, awaited_dispatch=True))):
        ledger = Ledger(tmp_path / f"{kind}-{point}-{index}.jsonl")
        with registry.override(Agent(kind, ScriptedLLM(SCRIPT), tools_of(ledger))):
            run = crash_then_take_over(start(kind, {}, clock=clock).pk, clock, crash, point,
                                       index)
            held = [a.kind for a in pending().filter(run_id=run.pk)]
            if held:  # a person lets it run once more
                approve(pending().get(run_id=run.pk).pk, by="olga")
                run = resume(run.pk, clock=clock, lease_seconds=1)
        outcome[kind] = (run.status, held, ledger.count("charge"), ledger.count("send"),
                         len(events(run, "side_effect.auto_confirmed")))
        assert verify(run.pk).ok
    assert outcome["async"] == outcome["sync"] == outcome["adispatch"], outcome


def _chat_transport(calls: list) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(json.loads(request.content))
        if len(calls) == 1:
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": "c1", "type": "function",
                "function": {"name": "charge", "arguments": json.dumps({"amount": 3})}}]}
        else:
            message = {"role": "assistant", "content": "paid"}
        return httpx.Response(200, json={"choices": [{"message": message}],
                                         "usage": {"prompt_tokens": 7, "completion_tokens": 2}})

    return httpx.MockTransport(answer)


def test_the_async_openai_client_drives_a_run(database, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    calls: list = []
    llm = AsyncOpenAIChat("http://llm.invalid/v1", "m", "sk-test",
                          transport=_chat_transport(calls))
    with registry.override(Agent("chat", llm, async_tools(ledger))):
        run = resume(start("chat", {"order": 1}, clock=clock).pk, clock=clock)
    assert run.status == "succeeded" and run.output == "paid"
    assert ledger.count("charge") == 1 and len(calls) == 2
    assert calls[1]["messages"][-1]["role"] == "tool"
    assert Run.objects.get(pk=run.pk).tokens_in == 14
    assert "sk-test" not in repr(llm)


def test_an_async_client_that_cannot_connect_fails_as_retryable(database, clock):
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    llm = AsyncOpenAIChat("http://llm.invalid/v1", "m", max_retries=0,
                          transport=httpx.MockTransport(refuse))
    with registry.override(Agent("down", llm, [])):
        run = resume(start("down", {}, clock=clock).pk, clock=clock)
    assert run.status == "failed" and "LLM connection failed" in run.failure_message
    (failed,) = events(run, "llm.failed")
    assert failed.payload["retryable"] is True


def test_a_worker_runs_async_tools_on_its_threads(database, tmp_path, spawn):
    with registry.override(*agents.AGENTS):
        runs = [start("asyncnotify", {"i": i}) for i in range(6)]
    worker = spawn("--burst", "--concurrency", "3")
    assert worker.wait(60) == 0, worker.output()
    assert set(Run.objects.filter(pk__in=[r.pk for r in runs]).values_list(
        "status", flat=True)) == {"succeeded"}
    ledger = Ledger(tmp_path / "ledger.jsonl")
    assert sorted(c["run"] for c in ledger.calls("async_notify")) == sorted(r.pk for r in runs)
    assert all(events(r, "step.tool_dispatched") for r in runs)
