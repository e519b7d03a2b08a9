"""Tools: typed functions with a declared effect and argument schemas built from their hints."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, get_type_hints

import pydantic

from runtime.agents.aio import (
    call_blocking,
    in_running_loop,
    off_the_loop,
    off_the_loop_async,
    run_awaitable,
)
from runtime.effects import Effect, EffectName
from runtime.errors import InvalidArguments


@dataclass
class ToolContext:
    """What a tool may know about its call; ``idempotency_key`` is the same on every attempt."""

    run_id: int
    step_index: int
    attempt: int
    idempotency_key: str
    agent: str
    _on_dispatch: Callable[[], None] = field(repr=False, default=lambda: None)
    dispatched: bool = False

    def dispatch(self) -> None:
        """Call right before the outbound request: records that the call may now go out.

        Until this returns, a crash provably left the outside world untouched, so the runtime
        may re-run the step on its own. Raises ``LeaseLost`` if this process no longer may act.
        """
        if not self.dispatched:
            if in_running_loop():  # from an async tool: the commit runs off the loop
                off_the_loop(self._on_dispatch)  # (which waits for it: prefer ``adispatch``)
            else:
                self._on_dispatch()
            self.dispatched = True

    async def adispatch(self) -> None:
        """``dispatch()`` for an ``async def`` tool: the same record, committed on a thread
        while the loop goes on (on the event-loop worker, the other runs with it), where a
        plain ``dispatch()`` holds the loop until its commit is done."""
        if not self.dispatched:
            await off_the_loop_async(self._on_dispatch)
            self.dispatched = True


@dataclass(frozen=True)
class ToolSpec:
    """What an LLM is told about a tool."""

    name: str
    description: str
    parameters: dict[str, Any]


class Tool:
    """A registered tool. Call it like the function; the runtime calls ``invoke``."""

    # Whether a person may change the arguments of a call a policy holds before allowing it
    # (``runtime.approvals.rules.approval_edit_refusal``); ``@tool(editable=False)`` forbids.
    editable: bool = True

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        effect: EffectName,
        max_attempts: int | None = None,
        dispatches: bool = False,
        name: str | None = None,
        description: str | None = None,
        blocks: bool = True,
        editable: bool = True,
    ) -> None:
        if effect not in Effect.values:
            raise ValueError(f"effect must be one of {', '.join(map(repr, Effect.values))}, "
                             f"not {effect!r}")
        self.fn = fn
        self.name = name or fn.__name__
        self.effect: str = effect
        self.max_attempts = max_attempts or (3 if effect == Effect.READ_ONLY else 1)
        self.dispatches = dispatches
        self.description = description or inspect.cleandoc(fn.__doc__ or "")
        self.takes_ctx, self.args_model = _arguments_model(fn, self.name)
        # An ``async def`` tool runs on the worker's event loop (``runtime.agents.aio``); a sync
        # one on its bounded pool, unless it declares it never waits (``blocks=False``).
        self.is_async = inspect.iscoroutinefunction(fn)
        self.blocks = blocks and not self.is_async
        self.editable = editable

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Tool {self.name} {self.effect}>"

    def validate(self, arguments: Any) -> dict[str, Any]:
        """Validated keyword arguments for the function, or ``InvalidArguments``."""
        if not isinstance(arguments, dict):
            raise InvalidArguments(self.name, "arguments must be a JSON object")
        try:
            model = self.args_model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            errors = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
                for err in exc.errors()
            )
            fields: dict[str, str] = {}
            for err in exc.errors():
                name = str(err["loc"][0]) if err["loc"] else ""
                where = ".".join(str(p) for p in err["loc"][1:])
                message = f"{where}: {err['msg']}" if where else err["msg"]
                fields[name] = f"{fields[name]}; {message}" if name in fields else message
            raise InvalidArguments(self.name, errors, fields) from None
        return {name: getattr(model, name) for name in self.args_model.model_fields}

    def json_schema(self) -> dict[str, Any]:
        return self.args_model.model_json_schema()

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.json_schema())

    def invoke(self, ctx: ToolContext, kwargs: dict[str, Any]) -> Any:
        """Call the tool: a blocking one on the event-loop worker's pool, an async one on its
        loop (on a thread worker: here, and on the thread's loop)."""
        if self.blocks:
            return call_blocking(self._call, ctx, kwargs)
        result = self._call(ctx, kwargs)
        return run_awaitable(result) if self.is_async else result

    def _call(self, ctx: ToolContext, kwargs: dict[str, Any]) -> Any:
        return self.fn(ctx, **kwargs) if self.takes_ctx else self.fn(**kwargs)


def _arguments_model(fn: Callable[..., Any], name: str) -> tuple[bool, type[pydantic.BaseModel]]:
    hints = get_type_hints(fn, include_extras=True)  # ``Annotated[int, Field(gt=0)]`` checks
    params = list(inspect.signature(fn).parameters.values())
    takes_ctx = bool(params) and (
        hints.get(params[0].name) is ToolContext or params[0].name == "ctx"
    )
    if takes_ctx:
        params = params[1:]
    fields: dict[str, Any] = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {name}: *args and **kwargs are not supported")
        if p.name not in hints:
            raise TypeError(f"tool {name}: parameter {p.name!r} needs a type hint")
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (hints[p.name], default)
    model = pydantic.create_model(
        f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
    )
    return takes_ctx, model


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    effect: EffectName,
    max_attempts: int | None = None,
    dispatches: bool = False,
    name: str | None = None,
    blocks: bool = True,
    editable: bool = True,
) -> Any:
    """Declare a tool. ``effect`` is required: the runtime must know whether a re-run is safe.

    ``dispatches=True`` promises that the tool calls ``ctx.dispatch()`` right before its outbound
    call, which lets the runtime re-run a crashed attempt that provably never got that far.
    ``blocks=False`` says a sync tool never waits (no I/O, no sleep, little CPU): the event-loop
    worker calls it on its loop rather than on its thread pool. An ``async def`` tool never
    blocks the loop unless it calls blocking code itself. ``editable=False`` forbids a person
    to change the arguments of a call its policy holds before allowing it (they may only allow
    or deny the call as the agent proposed it).
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(f, effect=effect, max_attempts=max_attempts, dispatches=dispatches, name=name,
                    blocks=blocks, editable=editable)

    return wrap(fn) if fn is not None else wrap
