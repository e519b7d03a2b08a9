"""A real MCP server for the crash matrix, over stdio (run by path: it imports nothing of the
runtime's). Its tools write each call to ``ledger.jsonl`` in ``RUNTIME_TEST_DIR`` with the run,
step, attempt and idempotency key the runtime sent in the request's ``_meta``: the outside
world's own record, as the native kit's tools keep it (``runtime.testkit.agents``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("kit")


def _record(name: str, ctx: Context, **data: Any) -> None:
    meta = dict(ctx.request_context.meta or {})
    row = {"call": name, "run": meta.get("agent-runtime/run"),
           "step": meta.get("agent-runtime/step"), "attempt": meta.get("agent-runtime/attempt"),
           "key": meta.get("agent-runtime/idempotency-key"), **data}
    path = Path(os.environ.get("RUNTIME_TEST_DIR", ".")) / "ledger.jsonl"
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup(order: int, ctx: Context) -> dict[str, Any]:
    """Read an order (annotated read-only)."""
    _record("lookup", ctx, order=order)
    return {"order": order, "amount": 7}


@server.tool()
def charge(amount: int, ctx: Context) -> dict[str, Any]:
    """Charge a card (no annotations: a side effect)."""
    _record("charge", ctx, amount=amount)
    return {"charged": amount}


if __name__ == "__main__":
    sys.exit(server.run())
