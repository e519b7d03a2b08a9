"""Pydantic AI agents for tests (``RUNTIME_AGENTS=...,tests.pai_agents.AGENTS`` for real
workers): a refund desk whose model is a ``FunctionModel`` (no network) that counts every
request it is sent, and whose tools write to the outside world's ledger."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import ModelRetry
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runtime.agents.pydanticai import PydanticAIAgent, call_context
from runtime.testkit.ledger import Ledger

DIR = Path(os.environ.get("RUNTIME_TEST_DIR", tempfile.gettempdir()))


def ledger() -> Ledger:
    return Ledger(DIR / "ledger.jsonl")


def requests_made() -> list[dict[str, Any]]:
    """Every request the model was sent (the model's own count, kept outside the runtime)."""
    return ledger().calls("model")


def tool_returns(messages: list[ModelMessage]) -> list[Any]:
    """What the tools returned so far, as the model sees it."""
    return [part.content for m in messages if isinstance(m, ModelRequest)
            for part in m.parts if isinstance(part, ToolReturnPart)]


def refund_desk_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Look the order up, refund it, send a note, then answer with what the tools said."""
    answered = sum(1 for m in messages if isinstance(m, ModelResponse))
    ledger().record("model", request=answered + 1, pid=os.getpid(),
                    seen=json.dumps(tool_returns(messages), sort_keys=True, default=str))
    order = "A-17"
    if answered == 0:
        return ModelResponse(parts=[ToolCallPart("lookup_order", {"order": order},
                                                 tool_call_id="c1")])
    if answered == 1:
        return ModelResponse(parts=[
            ToolCallPart("refund", {"order": order, "cents": 1250}, tool_call_id="c2"),
            ToolCallPart("send_note", {"order": order}, tool_call_id="c3")])
    return ModelResponse(parts=[TextPart(f"done: {tool_returns(messages)[-2:]}")])


def build(name: str = "pai-refunds", **kw: Any) -> PydanticAIAgent:
    agent = PydanticAgent(FunctionModel(refund_desk_model), name=name,
                          instructions="You run a refund desk.")

    @agent.tool_plain(metadata={"effect": "read_only"})
    def lookup_order(order: str) -> dict:
        """Find an order."""
        ctx = call_context()
        ledger().record("lookup_order", run=ctx.run_id, step=ctx.step_index,
                        attempt=ctx.attempt, key=ctx.idempotency_key)
        return {"order": order, "paid": 1250}

    @agent.tool_plain
    def refund(order: str, cents: int) -> dict:
        """Refund an order (no declaration: a side effect)."""
        ctx = call_context()
        ctx.dispatch()
        ledger().record("refund", run=ctx.run_id, step=ctx.step_index, attempt=ctx.attempt,
                        key=ctx.idempotency_key, cents=cents)
        return {"refunded": cents, "key": ctx.idempotency_key}

    @agent.tool_plain(metadata={"effect": "side_effect"})
    async def send_note(order: str) -> str:
        """Email the customer."""
        ctx = call_context()
        ledger().record("send_note", run=ctx.run_id, step=ctx.step_index,
                        attempt=ctx.attempt, key=ctx.idempotency_key)
        return f"note sent for {order}"

    return PydanticAIAgent(agent, **kw)


def retrying_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    answered = sum(1 for m in messages if isinstance(m, ModelResponse))
    ledger().record("model", request=answered + 1, pid=os.getpid())
    if answered < 2:
        return ModelResponse(parts=[ToolCallPart("flaky", {"n": answered},
                                                 tool_call_id=f"f{answered}")])
    return ModelResponse(parts=[TextPart("ok")])


def build_retrying(name: str = "pai-retry") -> PydanticAIAgent:
    agent = PydanticAgent(FunctionModel(retrying_model), name=name)

    @agent.tool_plain(metadata={"effect": "read_only"}, retries=3)
    def flaky(n: int) -> str:
        ledger().record("flaky", n=n)
        if n == 0:
            raise ModelRetry("try again with n=1")
        return "fine"

    return PydanticAIAgent(agent)


AGENTS = [build()]


def gated_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    answered = sum(1 for m in messages if isinstance(m, ModelResponse))
    ledger().record("model", request=answered + 1, pid=os.getpid(),
                    seen=json.dumps(tool_returns(messages), sort_keys=True, default=str))
    if answered == 0:
        return ModelResponse(parts=[
            ToolCallPart("wire_money", {"to": "acme", "cents": 900}, tool_call_id="w1"),
            ToolCallPart("close_account", {"who": "acme"}, tool_call_id="w2")])
    return ModelResponse(parts=[TextPart("wired")])


def build_gated(name: str = "pai-gated", **kw: Any) -> PydanticAIAgent:
    """Two tools that ask a person first (``requires_approval=True``)."""
    agent = PydanticAgent(FunctionModel(gated_model), name=name)

    @agent.tool_plain(requires_approval=True)
    def wire_money(to: str, cents: int) -> dict:
        ctx = call_context()
        ledger().record("wire_money", run=ctx.run_id, step=ctx.step_index,
                        attempt=ctx.attempt, key=ctx.idempotency_key)
        return {"wired": cents, "to": to}

    @agent.tool_plain(requires_approval=True)
    def close_account(who: str) -> str:
        ctx = call_context()
        ledger().record("close_account", run=ctx.run_id, step=ctx.step_index,
                        attempt=ctx.attempt, key=ctx.idempotency_key)
        return f"closed {who}"

    return PydanticAIAgent(agent, **kw)
