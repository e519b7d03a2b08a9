"""Agents for the crash matrix and the chaos soak, loaded by worker processes through
``RUNTIME_AGENTS=runtime.testkit.agents.AGENTS``.

Every agent reads (step 1), calls the tool under test (step 2), and answers (step 3). Tools
record each call in ``ledger.jsonl`` under ``RUNTIME_TEST_DIR``: the outside world's record.
``RUNTIME_KIT_TOOL_SECONDS`` gives tools a random latency up to that many seconds, so a kill at
a random moment can land in the middle of a call (the chaos soak uses it).
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from runtime import (
    Agent,
    Complete,
    Conflict,
    Continue,
    FinalAnswer,
    ReconcileView,
    RequireApproval,
    ScriptedLLM,
    ToolCall,
    ToolContext,
    Wait,
    tool,
)
from runtime.agents.llm import ScriptItem
from runtime.agents.policy import Allow, Request
from runtime.testkit.ledger import Ledger


def ledger() -> Ledger:
    return Ledger(Path(os.environ.get("RUNTIME_TEST_DIR", tempfile.gettempdir()))
                  / "ledger.jsonl")


def _latency() -> None:
    """The outside world's response time (zero unless RUNTIME_KIT_TOOL_SECONDS is set)."""
    most = float(os.environ.get("RUNTIME_KIT_TOOL_SECONDS", "0"))
    if most > 0:
        time.sleep(random.uniform(0, most))


@tool(effect="read_only")
def lookup(ctx: ToolContext, order: int) -> dict:
    """Read an order."""
    _latency()
    ledger().record_call("lookup", ctx, order=order)
    return {"order": order, "amount": 7}


def _hold(ctx: ToolContext) -> None:
    """With RUNTIME_KIT_HOLD_DIR set, a call that took effect waits, before it returns, until
    the test releases it: it marks ``entered-<run>-<attempt>`` and waits (up to 120 s) for
    ``release-<run>`` (a network fault can then strike while the call is in flight)."""
    where = os.environ.get("RUNTIME_KIT_HOLD_DIR")
    if not where:
        return
    Path(where, f"entered-{ctx.run_id}-{ctx.attempt}").touch()
    deadline = time.monotonic() + 120
    while not Path(where, f"release-{ctx.run_id}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # the outside world answering: polled, bounded


@tool(effect="side_effect")
def charge(ctx: ToolContext, amount: int) -> dict:
    """Charge a card (no dispatch record: a crash mid-call is always a question)."""
    _latency()
    ledger().record_call("charge", ctx, amount=amount)
    _hold(ctx)
    return {"charged": amount, "key": ctx.idempotency_key}


@tool(effect="side_effect", dispatches=True)
def send(ctx: ToolContext, to: str) -> dict:
    """Send mail; records ctx.dispatch() just before the call goes out."""
    ctx.dispatch()
    _latency()
    ledger().record_call("send", ctx, to=to)
    return {"sent": to}


def reconcile_by_ledger(view: ReconcileView) -> Any:
    """A truthful reconcile: look the idempotency key up in the outside world."""
    if view.tool != "charge":
        return Continue()
    found = ledger().has_key(view.idempotency_key)
    return Complete({"charged": found["amount"], "key": view.idempotency_key}) if found \
        else Continue()


def reconcile_wait(view: ReconcileView) -> Any:
    if view.tool != "charge":
        return Continue()
    return Wait(f"Check the card processor for {view.idempotency_key}")


def reconcile_conflict(view: ReconcileView) -> Any:
    if view.tool != "charge":
        return Continue()
    return Conflict("the processor's books disagree with the run")


def approve_charges(request: Request, run: Any) -> Any:
    """Charges need a person's approval before they start."""
    if request.tool == "charge":
        return RequireApproval(f"Charge {request.arguments['amount']}?")
    return Allow()


TOOLS = [lookup, charge, send]
UNDER_TEST = {"read": ToolCall("lookup", {"order": 2}), "charge": ToolCall("charge", {"amount": 7}),
              "send": ToolCall("send", {"to": "ann@example.com"})}


def _agent(name: str, call: ToolCall, reconcile: Any = None, policy: Any = None) -> Agent:
    script: list[ScriptItem] = [ToolCall("lookup", {"order": 1}), call, FinalAnswer({"done": name})]
    return Agent(name, ScriptedLLM(script), TOOLS, reconcile=reconcile, policy=policy)


# The matrix's tool kinds: agent name -> agent.
KINDS = {
    "read": _agent("read", UNDER_TEST["read"]),
    "charge": _agent("charge", UNDER_TEST["charge"]),
    "send": _agent("send", UNDER_TEST["send"]),
    "reconcile-check": _agent("reconcile-check", UNDER_TEST["charge"], reconcile_by_ledger),
    "reconcile-wait": _agent("reconcile-wait", UNDER_TEST["charge"], reconcile_wait),
    "reconcile-conflict": _agent("reconcile-conflict", UNDER_TEST["charge"],
                                 reconcile_conflict),
}
# Also used by the chaos soak: a charge that needs approval before it starts.
GATED = _agent("charge-approved", UNDER_TEST["charge"], policy=approve_charges)
# The same, for runs a schedule with a standing authorization fires (``ProcessKit.
# start_scheduled``): its charge starts auto-confirmed, never asking a person first.
SCHEDULED = _agent("scheduled-charge", UNDER_TEST["charge"], policy=approve_charges)
AGENTS = [*KINDS.values(), GATED, SCHEDULED]
