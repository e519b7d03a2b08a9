"""The bench's Pydantic AI agent: ``bench_wait``'s twin (four no-op reads, then the answer, a
model that answers after 100 ms by awaiting, as a network call does), for the in-flight
section's agents line. Loaded by its workers only (``RUNTIME_AGENTS=...,runtime.benchkit.
pai_agents.AGENTS``): Pydantic AI takes a second to import."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runtime.agents.agent import Budget
from runtime.agents.pydanticai import PydanticAIAgent
from runtime.benchkit.agents import WAIT_SECONDS, WAIT_TOOL_CALLS

PATH = "runtime.benchkit.pai_agents.AGENTS"


def _answering(wait: float) -> Callable[[list[ModelMessage], AgentInfo],
                                       Awaitable[ModelResponse]]:
    async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        await asyncio.sleep(wait)
        done = sum(1 for m in messages if isinstance(m, ModelResponse))
        if done < WAIT_TOOL_CALLS:
            return ModelResponse(parts=[ToolCallPart("bench_read", {"n": done + 1})])
        return ModelResponse(parts=[TextPart(f"read {done}")])

    return answer


def _agent(wait: float = WAIT_SECONDS) -> PydanticAIAgent:
    agent: PydanticAgent[None, str] = PydanticAgent(FunctionModel(_answering(wait)),
                                                    name="bench_pai_wait")

    @agent.tool_plain(metadata={"effect": "read_only"})
    async def bench_read(n: int) -> dict[str, int]:
        """A read that does nothing."""
        return {"n": n}

    return PydanticAIAgent(agent, budget=Budget(max_steps=50, max_llm_requests=50))


AGENTS = [_agent()]


def own_cpu_ms_per_request(runs: int = 40) -> float:
    """Pydantic AI's own CPU per model request, without the runtime: the same agent run
    ``runs`` times in this process (tools one after another, as the runtime runs them) with a
    model that answers at once. What one process can give Pydantic AI runs at most."""
    agent = _agent(wait=0).pydantic_agent

    async def all_runs(n: int) -> None:
        with agent.parallel_tool_call_execution_mode("sequential"):
            for _ in range(n):
                await agent.run("{}")

    asyncio.run(all_runs(3))  # imports and first-call costs aside
    began = time.process_time()
    asyncio.run(all_runs(runs))
    return (time.process_time() - began) * 1000 / (runs * (WAIT_TOOL_CALLS + 1))
