"""The bench's Pydantic AI agent: ``bench_wait``'s twin (four no-op reads, then the answer, a
model that answers after 100 ms by awaiting, as a network call does), for the in-flight
section's agents line. Loaded by its workers only (``RUNTIME_AGENTS=...,runtime.benchkit.
pai_agents.AGENTS``): Pydantic AI takes a second to import."""

from __future__ import annotations

import asyncio

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runtime.agents.agent import Budget
from runtime.agents.pydanticai import PydanticAIAgent
from runtime.benchkit.agents import WAIT_SECONDS, WAIT_TOOL_CALLS

PATH = "runtime.benchkit.pai_agents.AGENTS"


async def _answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    await asyncio.sleep(WAIT_SECONDS)
    done = sum(1 for m in messages if isinstance(m, ModelResponse))
    if done < WAIT_TOOL_CALLS:
        return ModelResponse(parts=[ToolCallPart("bench_read", {"n": done + 1})])
    return ModelResponse(parts=[TextPart(f"read {done}")])


def _agent() -> PydanticAIAgent:
    agent: PydanticAgent[None, str] = PydanticAgent(FunctionModel(_answer),
                                                    name="bench_pai_wait")

    @agent.tool_plain(metadata={"effect": "read_only"})
    async def bench_read(n: int) -> dict[str, int]:
        """A read that does nothing."""
        return {"n": n}

    return PydanticAIAgent(agent, budget=Budget(max_steps=50, max_llm_requests=50))


AGENTS = [_agent()]
