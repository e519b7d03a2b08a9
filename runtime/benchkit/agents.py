"""The bench's agents: a scripted LLM with no latency and no-op tools, so what is measured is
the runtime's own cost per step (its commits and its CPU), nothing else.

Registered in worker subprocesses with ``RUNTIME_AGENTS=runtime.benchkit.agents.AGENTS``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from runtime.agents.agent import Agent, Budget
from runtime.agents.llm import FinalAnswer, ScriptedLLM, ToolCall, Transcript
from runtime.agents.policy import Allow, PolicyDecision, Request, RequireApproval
from runtime.agents.tools import tool
from runtime.effects import Effect

STEPS = 10  # tool steps per bench run (then one final answer)


@tool(effect="read_only", blocks=False)
def bench_read(n: int) -> dict:
    """A read that does nothing."""
    return {"n": n}


@tool(effect="side_effect", blocks=False)
def bench_write(n: int) -> dict:
    """A side effect that does nothing."""
    return {"n": n}


TOOLS = [bench_read, bench_write]


def _script(tool_name: str, steps: int) -> Any:
    """One tool call per step until the run's ``{"steps": N}`` (default ``steps``) are done,
    then a final answer; O(1) per call, so long runs cost the runtime, not the script."""

    def decide(transcript: Transcript) -> ToolCall | FinalAnswer:
        done = len(transcript.entries)
        want = steps
        if isinstance(transcript.input, dict):
            want = int(transcript.input.get("steps", steps))
        if done < want:
            return ToolCall(tool_name, {"n": done + 1})
        return FinalAnswer({"steps": done})

    return decide


MAX_STEPS = 2_000


def steps_agent(name: str, tool_name: str, steps: int = STEPS) -> Agent:
    """An agent whose runs are N calls of one no-op tool, then a final answer."""
    budget = Budget(max_steps=MAX_STEPS + 1, max_llm_requests=MAX_STEPS + 1)
    return Agent(name, ScriptedLLM(_script(tool_name, steps), blocks=False), TOOLS, budget=budget)


WAIT_SECONDS = 0.1  # bench_wait's LLM answers after this long, every call
WAIT_TOOL_CALLS = 4  # bench_wait's runs: this many no-op reads, then the final answer


def _waiting(decide: Any, seconds: float) -> Any:
    """An async model client that takes ``seconds`` to answer (an ``asyncio.sleep``: it waits
    as one on a network does)."""

    async def slow(transcript: Transcript) -> ToolCall | FinalAnswer:
        await asyncio.sleep(seconds)
        return decide(transcript)

    return slow


def _approve_writes(request: Request, run: Any) -> PolicyDecision:
    if request.effect == Effect.SIDE_EFFECT:
        return RequireApproval("bench: approve a no-op write", f"n={request.arguments.get('n')}")
    return Allow()


AGENTS = [
    steps_agent("bench_read", "bench_read"),
    steps_agent("bench_write", "bench_write"),
    # Runs of 4 no-op reads and a final answer (5 steps) whose LLM answers after 100 ms: the
    # in-flight section (``runtime.benchkit.inflight``).
    Agent("bench_wait", ScriptedLLM(_waiting(_script("bench_read", WAIT_TOOL_CALLS),
                                             WAIT_SECONDS)), TOOLS),
    # One step needing a person's approval: for approval-to-restart latency.
    Agent("bench_approve", ScriptedLLM(_script("bench_write", 1), blocks=False), TOOLS,
          policy=_approve_writes),
    # A run that ends at once (3 commits): many of them for the worker's memory over time.
    Agent("bench_final", ScriptedLLM([FinalAnswer("done")]), TOOLS),
]
