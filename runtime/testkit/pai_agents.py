"""Pydantic AI agents for the crash matrix (``RUNTIME_AGENTS=runtime.testkit.pai_agents.AGENTS``).

The same shape as ``runtime.testkit.agents``: every agent reads (step 1), calls the tool under
test (step 2) and answers. The model is a ``FunctionModel`` (no network) that writes each
request it is sent to the ledger as ``model`` (the outside world's count of requests); the
tools record their calls there as the native kit's do.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runtime.agents.pydanticai import PydanticAIAgent, call_context
from runtime.testkit.agents import ledger

UNDER_TEST: dict[str, tuple[str, dict[str, Any]]] = {
              "pai-read": ("lookup", {"order": 2}), "pai-charge": ("charge", {"amount": 7}),
              "pai-send": ("send", {"to": "ann@example.com"})}


def _model(kind: str) -> FunctionModel:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        made = sum(1 for m in messages if isinstance(m, ModelResponse))
        ledger().record("model", kind=kind, request=made + 1, pid=os.getpid(),
                        prompt=_prompt(messages))
        if made == 0:
            return ModelResponse(parts=[ToolCallPart("lookup", {"order": 1})])
        if made == 1:
            tool, args = UNDER_TEST[kind]
            return ModelResponse(parts=[ToolCallPart(tool, args)])
        return ModelResponse(parts=[TextPart(f"done: {kind}")])

    return FunctionModel(answer)


def _prompt(messages: list[ModelMessage]) -> str:
    """The run's input as the agent was given it (which run a request belongs to)."""
    return next((str(part.content) for m in messages if isinstance(m, ModelRequest)
                 for part in m.parts if isinstance(part, UserPromptPart)), "")


def _agent(kind: str) -> PydanticAIAgent:
    agent: PydanticAgent[None, str] = PydanticAgent(_model(kind), name=kind)

    @agent.tool_plain(metadata={"effect": "read_only"})
    def lookup(order: int) -> dict[str, Any]:
        """Read an order."""
        ledger().record_call("lookup", call_context(), order=order)
        return {"order": order, "amount": 7}

    @agent.tool_plain
    def charge(amount: int) -> dict[str, Any]:
        """Charge a card (no declaration: a side effect)."""
        ctx = call_context()
        ledger().record_call("charge", ctx, amount=amount)
        return {"charged": amount, "key": ctx.idempotency_key}

    @agent.tool_plain(metadata={"effect": "side_effect", "dispatches": True})
    def send(to: str) -> dict[str, Any]:
        """Send mail; records the dispatch just before the call goes out."""
        ctx = call_context()
        ctx.dispatch()
        ledger().record_call("send", ctx, to=to)
        return {"sent": to}

    return PydanticAIAgent(agent)


KINDS = {kind: _agent(kind) for kind in UNDER_TEST}
AGENTS = list(KINDS.values())
