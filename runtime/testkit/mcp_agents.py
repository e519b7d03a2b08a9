"""Agents whose tools come from a real MCP server process, for the crash matrix
(``RUNTIME_AGENTS=runtime.testkit.mcp_agents.AGENTS``): the shape of ``runtime.testkit.agents``
(read at step 1, the tool under test at step 2, then the answer), every call made over stdio to
``runtime/testkit/mcp_server.py``, which keeps the outside world's ledger."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from runtime.agents.agent import Agent
from runtime.agents.llm import FinalAnswer, ScriptedLLM, ToolCall
from runtime.agents.mcp import MCPServer

SERVER = [sys.executable, str(Path(__file__).with_name("mcp_server.py"))]
UNDER_TEST = {"mcp-read": ToolCall("lookup", {"order": 2}),
              "mcp-charge": ToolCall("charge", {"amount": 7})}


def _agents() -> list[Agent]:
    kit = MCPServer("kit", command=SERVER, trusted=True, env={
        "RUNTIME_TEST_DIR": os.environ.get("RUNTIME_TEST_DIR", tempfile.gettempdir())})
    tools = kit.tools()
    return [Agent(kind, ScriptedLLM([ToolCall("lookup", {"order": 1}), call,
                                     FinalAnswer({"done": kind})]), tools)
            for kind, call in UNDER_TEST.items()]


AGENTS = _agents()
