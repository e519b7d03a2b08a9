"""Agents for the console's browser tests, run by real worker processes
(``RUNTIME_AGENTS=tests.console.agents.AGENTS``). The tool writes to ``ledger.jsonl`` in
``RUNTIME_TEST_DIR``: the outside world's own record, which the runtime does not own."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from runtime import Agent, FinalAnswer, ScriptedLLM, ToolCall, ToolContext, tool
from tests.kit import Ledger

# Markup in the arguments: the console must show it as text.
RECIPIENT = "<script>document.title='pwned'</script>"


def ledger() -> Ledger:
    return Ledger(Path(os.environ.get("RUNTIME_TEST_DIR", tempfile.gettempdir())) / "ledger.jsonl")


@tool(effect="side_effect")
def pay(ctx: ToolContext, to: str, amount_cents: int) -> dict:
    """Pay someone; the ledger line is the payment."""
    ledger().record("pay", run=ctx.run_id, step=ctx.step_index, attempt=ctx.attempt,
                    key=ctx.idempotency_key, pid=os.getpid(), to=to, amount_cents=amount_cents)
    return {"paid": amount_cents}


@tool(effect="read_only")
def check(ctx: ToolContext) -> dict:
    """A read after the payment, so a resolved run has a next step to continue with."""
    return {"ok": True}


AGENTS = [
    Agent("payout", ScriptedLLM([ToolCall("pay", {"to": RECIPIENT, "amount_cents": 500}),
                                 ToolCall("check"), FinalAnswer("paid")]), [pay, check]),
]
