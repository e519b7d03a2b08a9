"""The "refund desk": look an order up, refund it through the payment provider, mail the
customer. The refund uses ``ctx.dispatch()`` and passes the step's idempotency key to the
provider; refunds above ``REFUND_APPROVAL_CENTS`` need a person's approval before they start.

The LLM is scripted (no network) unless ``RUNTIME_DEMO_LLM=openai``, which uses
``OpenAIChat.from_env()`` (``RUNTIME_LLM_BASE_URL``, ``RUNTIME_LLM_MODEL``, ...).
"""

from __future__ import annotations

from typing import Any

from demo import world
from runtime import (
    Agent,
    Allow,
    FinalAnswer,
    OpenAIChat,
    Request,
    RequireApproval,
    ScriptedLLM,
    ToolCall,
    ToolContext,
    Transcript,
    conf,
    tool,
)

REFUND_APPROVAL_CENTS: int = conf.value("RUNTIME_DEMO_APPROVAL_CENTS")


@tool(effect="read_only")
def lookup_order(ctx: ToolContext, order_id: int) -> dict:
    """Look an order up in the shop's records: customer, email, item and amount."""
    order = world.lookup_order(order_id)
    if order is None:
        raise LookupError(f"no order {order_id}")
    return order


@tool(effect="side_effect", dispatches=True)
def issue_refund(ctx: ToolContext, order_id: int, amount_cents: int) -> dict:
    """Refund an order through the payment provider (idempotent by the step's key)."""
    if amount_cents <= 0:
        raise ValueError("a refund must be positive")
    ctx.dispatch()  # durable before the request leaves: a crash before this is provably safe
    return world.refund(order_id, amount_cents, key=ctx.idempotency_key)


@tool(effect="side_effect")
def send_email(ctx: ToolContext, to: str, subject: str, body: str) -> dict:
    """Send an email to a customer (the mail server does not deduplicate)."""
    return world.send_mail(to, subject, body, key=ctx.idempotency_key)


def refund_policy(request: Request, run: Any) -> Allow | RequireApproval:
    amount = request.arguments.get("amount_cents", 0)
    if request.tool == "issue_refund" and amount > REFUND_APPROVAL_CENTS:
        return RequireApproval(
            f"Refund {world.money(amount)} on order {request.arguments.get('order_id')}?",
            f"Refunds above {world.money(REFUND_APPROVAL_CENTS)} need a person's approval.")
    return Allow()


def scripted_refund_desk(transcript: Transcript) -> ToolCall | FinalAnswer:
    """What a model would do for {"order_id": N, "reason": "..."}, deterministically."""
    order_id = int((transcript.input or {}).get("order_id", 0))
    done = transcript.entries
    if not done:
        return ToolCall("lookup_order", {"order_id": order_id})
    order = done[0].result
    if done[-1].error:
        return FinalAnswer({"order_id": order_id, "refunded": False, "why": done[-1].error})
    if len(done) == 1:
        return ToolCall("issue_refund", {"order_id": order_id,
                                         "amount_cents": order["amount_cents"]})
    if len(done) == 2:
        amount = world.money(order["amount_cents"])
        return ToolCall("send_email", {
            "to": order["email"], "subject": f"Your refund for order {order_id}",
            "body": f"Dear {order['customer']}, we refunded {amount} for your {order['item']}."})
    return FinalAnswer({"order_id": order_id, "refunded": order["amount_cents"]})


SYSTEM_PROMPT = (
    "You are a refund desk. For the order in the user's message: look it up with "
    "lookup_order, refund its full amount with issue_refund, then email the customer with "
    "send_email, and answer with a one-line summary. Never refund twice.")


def _llm() -> Any:
    if conf.value("RUNTIME_DEMO_LLM") == "openai":

        return OpenAIChat.from_env(system_prompt=SYSTEM_PROMPT)
    return ScriptedLLM(scripted_refund_desk)


refund_desk = Agent("refund-desk", _llm(), [lookup_order, issue_refund, send_email],
                    policy=refund_policy)
AGENTS = [refund_desk]
