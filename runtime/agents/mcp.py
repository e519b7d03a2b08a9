"""Tools from an MCP server, for native agents (``MCPServer.tools()``) and Pydantic AI agents
(``MCPServer.toolset()``), each with the effect the runtime's contract needs.

A tool's effect comes from its annotations only as far as they make it stricter: an MCP client
must not make tool-use decisions from the annotations of a server it does not trust, so
``readOnlyHint: true`` makes a tool read-only only on a server configured ``trusted=True``.
Anything else (no annotations, ``readOnlyHint`` false or absent) is a side effect. The
operator's ``effects={"tool": "read_only"}`` wins over both.

Each call opens its own session (a stdio server is started for it and ended after): a server
that cannot be reached is a tool failure the agent sees, and a server that goes away after the
call was sent raises ``CallOutcomeUnknown``, which the runtime settles as an interrupted call
(a read-only tool is made again; a side effect waits for a person).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import mcp_types
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from runtime.agents.aio import run_awaitable
from runtime.agents.pydanticai import SOURCE_CONFIGURED
from runtime.agents.tools import Tool, ToolContext, ToolSpec
from runtime.effects import Effect
from runtime.errors import CallOutcomeUnknown, InvalidArguments, MCPServerDown, MCPToolError

MAX_RESULT_CHARS = 1_000_000  # what one call's text content may add up to (more is cut)
# JSON-RPC errors by which a server refuses a request without running it.
REFUSALS = frozenset({-32700, -32600, -32601, -32602})


class MCPServer:
    """An MCP server: a command started over stdio, or a streamable HTTP ``url``."""

    def __init__(self, name: str, *, command: Sequence[str] | None = None,
                 url: str | None = None, trusted: bool = False,
                 effects: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None,
                 timeout: float = 60.0) -> None:
        if (command is None) == (url is None):
            raise ValueError(f"MCP server {name}: give a command or a url, not both")
        for tool_name, effect in (effects or {}).items():
            if effect not in Effect.values:
                raise ValueError(f"MCP server {name}: effects[{tool_name!r}] must be one of "
                                 f"{', '.join(map(repr, Effect.values))}, not {effect!r}")
        self.name, self.url, self.trusted = name, url, trusted
        self.command = list(command) if command is not None else None
        self.effects = dict(effects or {})
        self.env = dict(env or {})
        self.timeout = timeout
        self._listed: list[mcp_types.Tool] | None = None

    def __repr__(self) -> str:
        return f"<MCPServer {self.name}>"

    # -- the rules ----------------------------------------------------------------------------

    def classify(self, tool: mcp_types.Tool) -> tuple[str, str]:
        """A tool's effect and where it came from (the approval page shows the second)."""
        if tool.name in self.effects:
            return self.effects[tool.name], SOURCE_CONFIGURED
        hints = tool.annotations
        if hints is None:
            return Effect.SIDE_EFFECT.value, "no annotations: treated as a side effect"
        if hints.read_only_hint is True:
            if self.trusted:
                return Effect.READ_ONLY.value, f"annotated read-only by server {self.name}"
            return (Effect.SIDE_EFFECT.value,
                    f"annotated read-only by server {self.name}, which is not trusted: "
                    "treated as a side effect")
        return Effect.SIDE_EFFECT.value, f"not annotated read-only by server {self.name}"

    # -- talking to the server ----------------------------------------------------------------

    def _client(self) -> Client:
        if self.command is not None:
            params = StdioServerParameters(command=self.command[0], args=self.command[1:],
                                           env={**_inherited_env(), **self.env})
            return Client(params, read_timeout_seconds=self.timeout)
        assert self.url is not None, "a server has a command or a url"
        return Client(self.url, read_timeout_seconds=self.timeout)

    async def alist_tools(self) -> list[mcp_types.Tool]:
        """The server's tools (listed once per process, then remembered)."""
        if self._listed is None:
            try:
                async with self._client() as client:
                    listed = await client.list_tools()
            except Exception as exc:
                raise MCPServerDown(self.name, f"{type(exc).__name__}: {exc}") from None
            self._listed = list(listed.tools)
        return self._listed

    async def acall(self, tool: str, arguments: dict[str, Any],
                    ctx: ToolContext | None = None) -> Any:
        """Call ``tool``: its structured content, else its text. ``MCPServerDown`` if the call
        was never sent; ``MCPToolError`` if the server refused it (invalid arguments, no such
        tool) or answered that it failed; ``CallOutcomeUnknown`` if the server went away
        after it was sent, or gave no answer. The call's idempotency key, run, step and
        attempt go to the server in the request's ``_meta`` (``agent-runtime/idempotency-key``,
        ...): a server may deduplicate by it."""
        stack = contextlib.AsyncExitStack()
        try:
            try:
                client = await stack.enter_async_context(self._client())
            except Exception as exc:  # nothing was sent
                raise MCPServerDown(self.name, f"{type(exc).__name__}: {exc}") from None
            try:
                result = await client.call_tool(tool, arguments, meta=call_meta(ctx))
            except MCPError as exc:
                if exc.code in REFUSALS:  # the server answered: it did not run the tool
                    raise MCPToolError(self.name, tool, exc.message) from None
                raise CallOutcomeUnknown(tool, f"MCP server {self.name} gave no answer "
                                               f"({exc.message})") from None
            except Exception as exc:  # sent, and no answer came back
                raise CallOutcomeUnknown(tool, f"MCP server {self.name} went away during "
                                               f"the call ({type(exc).__name__}: {exc})"
                                         ) from None
        finally:
            await _close_quietly(stack)
        return _result(self.name, tool, result)

    # -- for agents ---------------------------------------------------------------------------

    def tools(self) -> list[Tool]:
        """The server's tools as native tools (listed now; the server must be up)."""
        return [MCPTool(self, t) for t in run_awaitable(self.alist_tools())]

    def toolset(self) -> Any:
        """The server's tools as a Pydantic AI toolset (listed when a run first needs them)."""
        from runtime.agents.mcp_toolset import MCPToolset  # Pydantic AI loads where used

        return MCPToolset(self)


class MCPTool(Tool):
    """One tool of an MCP server, called over its own session."""

    editable = False  # its schema is the server's to check: an edit could not be checked here

    def __init__(self, server: MCPServer, listed: mcp_types.Tool) -> None:
        self.server, self.listed = server, listed
        self.fn = _not_called
        self.name = listed.name
        self.effect, self.effect_source = server.classify(listed)
        self.max_attempts = 3 if self.effect == Effect.READ_ONLY else 1
        self.dispatches = False
        self.description = listed.description or ""
        self.takes_ctx, self.is_async, self.blocks = True, True, False

    def validate(self, arguments: Any) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise InvalidArguments(self.name, "arguments must be a JSON object")
        return dict(arguments)  # the server checks them against its own schema

    def json_schema(self) -> dict[str, Any]:
        return dict(self.listed.input_schema or {"type": "object"})

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.json_schema())

    def invoke(self, ctx: ToolContext, kwargs: dict[str, Any]) -> Any:
        return run_awaitable(self.server.acall(self.name, kwargs, ctx))


def call_meta(ctx: ToolContext | None) -> Any:
    """What a call tells the server of itself, in ``_meta`` (None outside a run's call)."""
    if ctx is None:
        return None
    return {"agent-runtime/idempotency-key": ctx.idempotency_key,
            "agent-runtime/run": ctx.run_id, "agent-runtime/step": ctx.step_index,
            "agent-runtime/attempt": ctx.attempt}


def _result(server: str, tool: str, result: mcp_types.CallToolResult) -> Any:
    """What the call gave: an error it reported, its structured content, or its text (cut to
    ``MAX_RESULT_CHARS``: the call happened, so its outcome is kept, shortened)."""
    text = "\n".join(c.text for c in result.content if isinstance(c, mcp_types.TextContent))
    if len(text) > MAX_RESULT_CHARS:
        text = (f"{text[:MAX_RESULT_CHARS]}... [cut: the answer had {len(text)} characters, "
                f"{MAX_RESULT_CHARS} are kept]")
    if result.is_error:
        raise MCPToolError(server, tool, text)
    if result.structured_content is not None:
        return result.structured_content
    return text


async def _close_quietly(stack: contextlib.AsyncExitStack) -> None:
    with contextlib.suppress(Exception):
        await stack.aclose()


def _inherited_env() -> dict[str, str]:
    """What a stdio server inherits: the path to find its interpreter, nothing secret."""
    keep = ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV")
    return {k: os.environ[k] for k in keep if k in os.environ} | {
        "PYTHONUNBUFFERED": "1", "PYTHONEXECUTABLE": sys.executable}


def _not_called(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("an MCP tool is called through its server")
