"""Agents for tests that run real worker processes (``RUNTIME_AGENTS=tests.agents.AGENTS``).

Their tools write to ``ledger.jsonl`` in ``RUNTIME_TEST_DIR``: the outside world's own record,
which survives the worker being killed. ``slow`` tools wait for a release file the test writes.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from pathlib import Path

from runtime import Agent, FinalAnswer, ScriptedLLM, ToolCall, ToolContext, tool
from tests.kit import Ledger

DIR = Path(os.environ.get("RUNTIME_TEST_DIR", tempfile.gettempdir()))


def ledger() -> Ledger:
    return Ledger(DIR / "ledger.jsonl")


def _hold(name: str, ctx: ToolContext) -> None:
    """Announce entry, then wait (bounded) until the test writes the release file."""
    (DIR / f"entered-{name}-{ctx.run_id}-{ctx.attempt}").write_text(str(os.getpid()))
    release = DIR / f"release-{name}"
    deadline = time.monotonic() + 120
    while not release.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{release} never appeared")
        time.sleep(0.01)


def _record(name: str, ctx: ToolContext, **data) -> None:
    most = float(os.environ.get("RUNTIME_TEST_TOOL_SECONDS", "0"))  # the world's latency
    if most > 0:
        time.sleep(random.uniform(0, most))
    ledger().record(name, run=ctx.run_id, step=ctx.step_index, attempt=ctx.attempt,
                    key=ctx.idempotency_key, pid=os.getpid(), **data)


@tool(effect="read_only")
def noop(ctx: ToolContext, n: int) -> dict:
    """Do nothing, on the record."""
    _record("noop", ctx, n=n)
    return {"n": n}


@tool(effect="read_only")
def slow_read(ctx: ToolContext) -> dict:
    """A read that takes as long as the test wants."""
    _hold("slow_read", ctx)
    _record("slow_read", ctx)
    return {"read": True}


@tool(effect="side_effect")
def slow_charge(ctx: ToolContext, amount: int) -> dict:
    """A charge that takes as long as the test wants."""
    _hold("slow_charge", ctx)
    _record("slow_charge", ctx, amount=amount)
    return {"charged": amount}


@tool(effect="side_effect")
def fast_charge(ctx: ToolContext, amount: int) -> dict:
    """A charge that answers at once, on the record."""
    _record("fast_charge", ctx, amount=amount)
    return {"charged": amount}


@tool(effect="side_effect", dispatches=True)
def notify(ctx: ToolContext, to: str) -> dict:
    """Send a message; records ctx.dispatch() just before it goes out, on the record."""
    ctx.dispatch()
    _record("notify", ctx, to=to)
    return {"sent": to}


@tool(effect="side_effect", dispatches=True)
async def async_notify(ctx: ToolContext, to: str) -> dict:
    """An async send: awaits, records ctx.dispatch() before it goes out, on the record."""
    await asyncio.sleep(0.001)
    ctx.dispatch()
    _record("async_notify", ctx, to=to)
    return {"sent": to}


@tool(effect="read_only")
def long_read(ctx: ToolContext, seconds: float) -> dict:
    """A read that takes ``seconds`` (a long outside call, as the test sets it)."""
    time.sleep(seconds)
    _record("long_read", ctx, seconds=seconds)
    return {"read": seconds}


@tool(effect="read_only")
def boom(ctx: ToolContext) -> dict:
    """Always raises."""
    raise RuntimeError("the tool exploded")


def _llm_that_raises(transcript):
    raise ConnectionError("the LLM is down")


@tool(effect="read_only")
def count_runs(ctx: ToolContext) -> dict:
    """A sync read of the database (on the event-loop worker, from its pool's thread)."""
    from runtime.models import Run

    _record("count_runs", ctx)
    return {"runs": Run.objects.count()}


TOOLS = [noop, slow_read, slow_charge, fast_charge, notify, async_notify, long_read, boom,
         count_runs]

AGENTS = [
    Agent("steps5", ScriptedLLM([ToolCall("noop", {"n": i}) for i in range(5)]
                                + [FinalAnswer("done")]), TOOLS),
    Agent("slow", ScriptedLLM([ToolCall("slow_read"), FinalAnswer("done")]), TOOLS),
    Agent("slowpay", ScriptedLLM([ToolCall("slow_charge", {"amount": 5}), FinalAnswer("paid")]),
          TOOLS),
    Agent("llmdown", ScriptedLLM(_llm_that_raises), TOOLS),
    Agent("toolboom", ScriptedLLM([ToolCall("boom"), FinalAnswer("survived")]), TOOLS),
    Agent("final", ScriptedLLM([FinalAnswer("ok")]), TOOLS),
    Agent("mixed", ScriptedLLM([ToolCall("noop", {"n": 1}), ToolCall("fast_charge", {"amount": 3}),
                                ToolCall("noop", {"n": 2}), FinalAnswer("done")]), TOOLS),
    # read, pay, notify, pay: what a restore from a backup must not repeat on its own.
    Agent("paynotify", ScriptedLLM([ToolCall("noop", {"n": 1}),
                                    ToolCall("fast_charge", {"amount": 7}),
                                    ToolCall("notify", {"to": "ann@example.com"}),
                                    ToolCall("fast_charge", {"amount": 8}),
                                    FinalAnswer("paid")]), TOOLS),
    Agent("asyncnotify", ScriptedLLM([ToolCall("noop", {"n": 1}),
                                      ToolCall("async_notify", {"to": "ann@example.com"}),
                                      FinalAnswer("sent")]), TOOLS),
    Agent("long", ScriptedLLM([ToolCall("long_read", {"seconds": 10}), FinalAnswer("done")]),
          TOOLS),
    Agent("counts", ScriptedLLM([ToolCall("count_runs")] * 3 + [FinalAnswer("counted")]),
          TOOLS),
]
