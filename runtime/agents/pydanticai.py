"""A Pydantic AI agent registered as a runtime agent (``PydanticAIAgent``).

The agent keeps its own loop (model, instructions, toolsets, deps, output type); the runtime
records each of its model requests and tool calls as the run's steps and events, and puts an
interrupted side effect before a person, as for any agent (``runtime.loop.pydanticai`` does the
recording). What this module holds is what the registry, the policy and the recovery need to
know without running the agent: its name, budget, policy and each tool's effect.

A tool's effect is declared in its metadata, ``metadata={"effect": "read_only"}``; a tool with
no declaration is a side effect. The agent's ``effects`` mapping (an operator's per-tool
setting) wins over any declaration. ``metadata={"dispatches": True}`` promises that the tool
calls ``call_context().dispatch()`` right before its outbound call (``@tool(dispatches=True)``).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from runtime.agents.agent import Agent, Budget
from runtime.agents.policy import Deny, PolicyDecision, Request, RequireApproval, allow_all
from runtime.agents.tools import Tool, ToolContext
from runtime.canonical import dumps
from runtime.effects import Effect
from runtime.errors import InvalidArguments

# Where a tool's effect came from, as the approval page says it.
SOURCE_DECLARED = "declared in the tool's metadata"
SOURCE_DEFAULT = "no declaration: treated as a side effect"
SOURCE_CONFIGURED = "set by configuration"

_call: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar(
    "runtime_pydanticai_call", default=None)


def call_context() -> ToolContext:
    """The runtime's context of the tool call in progress (``idempotency_key``, ``attempt``,
    ``dispatch()``): what a native tool gets as ``ctx``, for a Pydantic AI tool."""
    ctx = _call.get()
    if ctx is None:
        raise LookupError("call_context() is only available inside a tool call of a run")
    return ctx


def effect_of(name: str, metadata: Mapping[str, Any] | None,
              overrides: Mapping[str, str]) -> tuple[str, str]:
    """A tool's effect and where it came from: the operator's setting, else the tool's own
    declaration (``metadata["effect"]``, with ``metadata["effect_source"]`` saying who made
    it), else a side effect."""
    if name in overrides:
        return overrides[name], SOURCE_CONFIGURED
    declared = (metadata or {}).get("effect")
    if declared in Effect.values:
        return str(declared), str((metadata or {}).get("effect_source") or SOURCE_DECLARED)
    return Effect.SIDE_EFFECT.value, SOURCE_DEFAULT


class ForeignTool(Tool):
    """A tool of a Pydantic AI agent as the runtime's rules see it: a name and an effect. Its
    arguments are checked by the agent's own schema when it calls the tool."""

    def __init__(self, name: str, effect: str, dispatches: bool = False) -> None:
        self.fn = _not_called
        self.name = name
        self.effect = effect
        self.max_attempts = 3 if effect == Effect.READ_ONLY else 1
        self.dispatches = dispatches
        self.description = ""
        self.takes_ctx = True
        self.is_async = False
        self.blocks = True

    def validate(self, arguments: Any) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise InvalidArguments(self.name, "arguments must be a JSON object")
        return dict(arguments)

    def json_schema(self) -> dict[str, Any]:
        return {"type": "object"}


def _not_called(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("a Pydantic AI agent's tools are called by the agent")


class PydanticAIAgent(Agent):
    """A ``pydantic_ai.Agent`` run by the runtime under the interruption contract.

    ``deps(run)`` builds the agent's dependencies for a run; ``prompt(input)`` the user prompt
    from the run's input (a string as it is, anything else as canonical JSON). ``effects``
    sets a tool's effect by name, over its metadata. ``policy`` and ``budget`` are the
    runtime's, as for a native agent; a tool with ``requires_approval=True`` asks a person
    in the console whatever the policy says.
    """

    def __init__(
        self,
        agent: Any,
        *,
        name: str | None = None,
        policy: Callable[[Request, Any], PolicyDecision] | None = None,
        budget: Budget | None = None,
        deps: Callable[[Any], Any] | None = None,
        prompt: Callable[[Any], str] | None = None,
        effects: Mapping[str, str] | None = None,
    ) -> None:
        agent_name = name or getattr(agent, "name", None)
        if not agent_name:
            raise ValueError("a Pydantic AI agent needs a name (Agent(name=...) or name=)")
        for tool_name, effect in (effects or {}).items():
            if effect not in Effect.values:
                raise ValueError(f"effects[{tool_name!r}] must be one of "
                                 f"{', '.join(map(repr, Effect.values))}, not {effect!r}")
        # The agent replays its own recorded model responses when resumed: a tool call it
        # sees must be the one its model made, so a person may not edit its calls.
        super().__init__(agent_name, llm=_NoLLM(), tools=[], budget=budget, editable=False)
        self.pydantic_agent = agent
        self.user_policy = policy or allow_all
        self.policy = self._policy
        self.deps = deps
        self.prompt = prompt or _default_prompt
        self.effects: dict[str, str] = dict(effects or {})
        self.needs_approval: set[str] = set(_approval_tools(agent))

    def __repr__(self) -> str:
        return f"<PydanticAIAgent {self.name}>"

    def tool_for(self, name: str, metadata: Mapping[str, Any] | None) -> tuple[Tool, str]:
        """The runtime's view of a tool the agent is calling, and where its effect came from."""
        effect, source = effect_of(name, metadata, self.effects)
        return ForeignTool(name, effect, bool((metadata or {}).get("dispatches"))), source

    def tool_for_step(self, step: Any) -> Tool | None:
        """The tool of a recorded step, for recovery: the operator's setting if there is one,
        else the effect recorded when the call was decided (by the same rules); its promise
        to call ``dispatch()`` as recorded when its attempt started."""
        effect = self.effects.get(step.tool) or step.effect or Effect.SIDE_EFFECT.value
        return ForeignTool(step.tool, effect, bool(step.dispatches))

    def _policy(self, request: Request, run: Any) -> PolicyDecision:
        verdict = self.user_policy(request, run)
        if request.tool in self.needs_approval and not isinstance(verdict, Deny | RequireApproval):
            return RequireApproval(f"Allow {request.tool}?",
                                   f"The agent's tool {request.tool} requires approval.")
        return verdict


class _NoLLM:
    """The agent asks its own model; nothing asks this one."""

    blocks = False

    def complete(self, *_args: Any) -> Any:
        raise RuntimeError("a Pydantic AI agent asks its own model")


def _default_prompt(value: Any) -> str:
    return value if isinstance(value, str) else dumps(value)


def _approval_tools(agent: Any) -> Iterable[str]:
    """Names of the agent's function tools declared ``requires_approval=True``."""
    for toolset in getattr(agent, "toolsets", ()):
        for name, t in (getattr(toolset, "tools", None) or {}).items():
            if getattr(t, "requires_approval", False):
                yield name
