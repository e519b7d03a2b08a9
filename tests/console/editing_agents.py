"""An agent for the browser test of editing a proposed call before allowing it
(``RUNTIME_AGENTS=tests.console.editing_agents.AGENTS``): every transfer asks a person first,
and its tool's arguments cover each kind of field the edit form has. The tool writes to
``ledger.jsonl`` in ``RUNTIME_TEST_DIR``, the outside world's own record."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from runtime import Agent, Allow, FinalAnswer, RequireApproval, ScriptedLLM, ToolCall, ToolContext
from runtime import tool as runtime_tool
from tests.console.agents import ledger

PROPOSED = {"account": "DE89 3704 0044 0532 0130 00", "amount": 90000, "currency": "EUR",
            "urgent": True, "memo": "Invoice 2026-117, second instalment",
            "tags": ["supplier", "q4"]}


@runtime_tool(effect="side_effect")
def transfer(ctx: ToolContext, account: str, amount: Annotated[int, Field(gt=0)],
             currency: Literal["EUR", "USD", "GBP"] = "EUR", urgent: bool = False,
             memo: str = "", tags: list[str] | None = None) -> dict:
    """Move money to an account (amount in cents)."""
    ledger().record_call("transfer", ctx, account=account, amount=amount, currency=currency,
                         urgent=urgent, memo=memo, tags=tags)
    return {"moved": amount, "to": account}


def _ask_first(request, run):
    return (RequireApproval("Move money?", "Every transfer asks a person first.")
            if request.tool == "transfer" else Allow())


AGENTS = [
    Agent("transfers", ScriptedLLM([ToolCall("transfer", PROPOSED), FinalAnswer("moved")]),
          [transfer], policy=_ask_first),
]
