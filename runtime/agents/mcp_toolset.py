"""An MCP server's tools as a Pydantic AI toolset (``MCPServer.toolset()``): each tool's
definition carries the effect the server's rules give it in its metadata, which the runtime
reads as for any Pydantic AI tool (``runtime.agents.pydanticai``)."""

from __future__ import annotations

from typing import Any

from pydantic_ai.exceptions import ModelRetry
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
from pydantic_core import SchemaValidator, core_schema

from runtime.agents.pydanticai import call_context
from runtime.errors import MCPServerDown, MCPToolError

_ANY_ARGUMENTS = SchemaValidator(schema=core_schema.dict_schema())


class MCPToolset(AbstractToolset[Any]):
    """The tools of one MCP server (an ``MCPServer``), listed when a run first needs them."""

    def __init__(self, server: Any) -> None:
        self.server = server

    @property
    def id(self) -> str | None:
        return f"mcp:{self.server.name}"

    async def get_tools(self, ctx: Any) -> dict[str, ToolsetTool[Any]]:
        listed = await self.server.alist_tools()  # down: the run fails, saying so (a run
        tools = {}  # resumed without the server's tools could not make its recorded calls)
        for tool in listed:
            effect, source = self.server.classify(tool)
            tools[tool.name] = ToolsetTool(
                toolset=self,
                tool_def=ToolDefinition(
                    name=tool.name, description=tool.description or "",
                    parameters_json_schema=dict(tool.input_schema or {"type": "object"}),
                    metadata={"effect": effect, "effect_source": source,
                              "mcp_server": self.server.name}),
                max_retries=1, args_validator=_ANY_ARGUMENTS)
        return tools

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any,
                        tool: ToolsetTool[Any]) -> Any:
        try:
            return await self.server.acall(name, tool_args, call_context())
        except (MCPServerDown, MCPToolError) as exc:  # nothing ran, or the server said it
            raise ModelRetry(str(exc)) from None  # failed: the agent sees it, may try again
