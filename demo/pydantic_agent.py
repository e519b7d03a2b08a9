"""The refund desk as a Pydantic AI agent (``make demo DEMO_ARGS="--agent pydantic-ai"``): the
same tools, world and policy as ``demo.agents``, run by Pydantic AI under the runtime's
contract (``runtime.agents.pydanticai``).

The model answers from a script (no network) unless ``RUNTIME_DEMO_LLM=openai``: then Pydantic
AI's OpenAI-compatible model asks the server of ``RUNTIME_LLM_BASE_URL`` / ``_MODEL`` /
``_API_KEY``.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

from demo import world
from demo.agents import SYSTEM_PROMPT, refund_policy
from runtime import conf
from runtime.agents.pydanticai import PydanticAIAgent, call_context

NAME = "refund-desk-pai"


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """What a model would do for {"order_id": N, ...}, deterministically (as the native
    desk's script does)."""
    asked = next(str(p.content) for m in messages if isinstance(m, ModelRequest)
                 for p in m.parts if isinstance(p, UserPromptPart))
    order_id = int(json.loads(asked).get("order_id", 0))
    returns = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts
               if isinstance(p, ToolReturnPart)]
    if not returns:
        return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": order_id})])
    order: Any = returns[0].content
    if not isinstance(order, dict):
        return ModelResponse(parts=[TextPart(f"order {order_id}: not refunded ({order})")])
    if len(returns) == 1:
        return ModelResponse(parts=[ToolCallPart(
            "issue_refund", {"order_id": order_id, "amount_cents": order["amount_cents"]})])
    if len(returns) == 2:
        amount = world.money(order["amount_cents"])
        return ModelResponse(parts=[ToolCallPart("send_email", {
            "to": order["email"], "subject": f"Your refund for order {order_id}",
            "body": f"Dear {order['customer']}, we refunded {amount} for your "
                    f"{order['item']}."})])
    return ModelResponse(parts=[TextPart(
        f"order {order_id}: refunded {world.money(order['amount_cents'])}")])


def _model() -> Model:
    if conf.value("RUNTIME_DEMO_LLM") != "openai":
        return FunctionModel(scripted)
    from pydantic_ai.models.openai import OpenAIChatModel  # (needs the openai package)
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel(conf.value("RUNTIME_LLM_MODEL"), provider=OpenAIProvider(
        base_url=conf.value("RUNTIME_LLM_BASE_URL"),
        api_key=conf.value("RUNTIME_LLM_API_KEY") or "none"))


desk: PydanticAgent[None, str] = PydanticAgent(_model(), name=NAME, instructions=SYSTEM_PROMPT)


@desk.tool_plain(metadata={"effect": "read_only"})
def lookup_order(order_id: int) -> dict[str, Any]:
    """Look an order up in the shop's records: customer, email, item and amount."""
    order = world.lookup_order(order_id)
    if order is None:
        raise LookupError(f"no order {order_id}")
    return order


@desk.tool_plain(metadata={"effect": "side_effect", "dispatches": True})
def issue_refund(order_id: int, amount_cents: int) -> dict[str, Any]:
    """Refund an order through the payment provider (idempotent by the step's key)."""
    ctx = call_context()
    ctx.dispatch()  # durable before the request leaves: a crash before this is provably safe
    return world.refund(order_id, amount_cents, key=ctx.idempotency_key)


@desk.tool_plain
def send_email(to: str, subject: str, body: str) -> dict[str, Any]:
    """Send an email to a customer (no declaration: a side effect)."""
    return world.send_mail(to, subject, body, key=call_context().idempotency_key)


AGENTS = [PydanticAIAgent(desk, policy=refund_policy)]
