"""A Pydantic AI agent's run: its own loop, the runtime's record and contract (design §5, §7).

Pydantic AI runs the agent (instructions, toolsets, deps, output type); a capability added to
each run records every model request and tool call as the run's events and steps, through the
same transitions a native run commits (``Execution``). A resumed run starts the agent again
from its input and gives it back what was recorded, in order: a recorded model response is
returned without asking the model, a finished tool call returns its recorded result (or its
recorded ``ModelRetry``) without calling the tool. The first call that was not finished follows
the interruption contract: a read-only call is made again; a side effect waits for a person,
whose "It happened" becomes the tool's return value. The agent's code between recorded calls
must therefore make the same calls in the same order when it runs again (``ReplayDiverged``
ends the run otherwise), as with any engine that replays.

The journal and the capability that keeps it are in ``runtime.loop.journal``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pydantic_core
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelResponse
from pydantic_ai.tools import DeferredToolResults

from runtime.agents.aio import run_awaitable
from runtime.agents.pydanticai import PydanticAIAgent
from runtime.canonical import check_payload
from runtime.errors import InvalidPayload, LeaseLost
from runtime.loop.execution import Execution
from runtime.loop.journal import Halt, Journal
from runtime.models import FailureCode


def run_pydantic_ai(ex: Execution) -> None:
    """Recover, run the agent to its end with its record given back, and finish the run."""
    agent = cast(PydanticAIAgent, ex.agent)
    journal = Journal(ex, agent)
    if not journal.recover():
        return
    try:
        # (built here, as the run's code: they may read the database or block)
        deps = agent.deps(ex.run) if agent.deps is not None else None
        prompt = agent.prompt(ex.run.input)
        output = run_awaitable(run_agent(journal, prompt, deps))
        journal.check_all_replayed()
    except BaseException as exc:
        stop = _control(exc)
        if isinstance(stop, Halt):
            return
        if stop is not None:
            raise stop from None
        assert isinstance(exc, Exception), "a BaseException of someone else's is a control one"
        plan = journal.plan()
        ex.fail(plan, FailureCode.ERROR, f"{type(exc).__name__}: {exc}")
        ex.commit(plan)
        return
    plan = journal.plan()
    try:
        value = check_payload("final answer", pydantic_core.to_jsonable_python(output))
    except (InvalidPayload, pydantic_core.PydanticSerializationError) as exc:
        ex.fail(plan, FailureCode.ERROR, str(exc))
    else:
        ex.finish(plan, value)
    ex.commit(plan)


def _control(exc: BaseException) -> BaseException | None:
    """The exception that must end this run's execution as it is (a halt, a lost lease, a
    simulated crash, a stop), found also inside exception groups; None for the agent's own."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _control(inner)
            if found is not None:
                return found
        return None
    if isinstance(exc, LeaseLost) or not isinstance(exc, Exception):
        return exc
    return None


async def run_agent(journal: Journal, prompt: str, deps: Any) -> Any:
    """The agent's run with the journal's capability added; its output."""
    agent = journal.agent.pydantic_agent
    with agent.parallel_tool_call_execution_mode("sequential"):
        result = await agent.run(prompt, deps=deps, capabilities=[_Recorder(journal)])
    return result.output


@dataclass(init=False)
class _Recorder(AbstractCapability[Any]):
    """The capability added to each run: every hook hands the call to the run's journal."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    async def wrap_model_request(self, ctx: Any, *, request_context: Any,
                                 handler: Any) -> ModelResponse:
        return await self.journal.model_request(request_context, handler)

    async def wrap_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any,
                                handler: Any) -> Any:
        return await self.journal.tool_call(ctx, call, tool_def, args, handler)

    async def handle_deferred_tool_calls(self, ctx: Any, *,
                                         requests: Any) -> DeferredToolResults | None:
        return await self.journal.deferred(ctx, requests)

