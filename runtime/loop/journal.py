"""A Pydantic AI run's journal: each model request and tool call the agent makes, recorded
through the run's transitions (``Execution``) and given back in order when the run is resumed
(``runtime.loop.pydanticai`` runs the agent with it; the design is described there).

The capability's hooks are coroutines on the run's loop; what they commit runs as synchronous
code in a greenlet of their own (``run_in_greenlet``), so the ORM and the worker's committer
work as for a native run, and the loop goes on with other runs while a commit waits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from typing import Any, TypeVar

import pydantic_core
from pydantic import TypeAdapter
from pydantic_ai.exceptions import ModelRetry, ToolRetryError
from pydantic_ai.messages import ModelRequestPart, ModelResponse
from pydantic_ai.tools import DeferredToolResults, ToolApproved

from runtime import crashpoints
from runtime.agents.aio import run_greenlet, run_in_greenlet
from runtime.agents.pydanticai import PydanticAIAgent, _call
from runtime.agents.tools import ToolContext
from runtime.canonical import check_payload, step_idempotency_key
from runtime.crashpoints import CrashPoint
from runtime.errors import CallOutcomeUnknown, InvalidPayload, LeaseLost, ReplayDiverged
from runtime.loop.execution import Execution, new_step
from runtime.loop.recovery import consume, interrupted
from runtime.models import Approval, ApprovalStatus, Event, FailureCode, Step, StepStatus
from runtime.storage.connections import connection_release
from runtime.storage.plan import Add, Plan

T = TypeAdapter(ModelResponse)
PARTS: TypeAdapter[Any] = TypeAdapter(ModelRequestPart)
R = TypeVar("R")
_FINISHED = (StepStatus.SUCCEEDED, StepStatus.FAILED)
_RETRY = "ModelRetry: "


class Halt(BaseException):
    """The run paused, ended or was released inside one of the agent's calls: the agent's run
    is unwound (a BaseException, so neither Pydantic AI nor a tool catches it)."""


class ToolFailed(RuntimeError):
    """A recorded tool call that failed, raised again where the agent made it."""


@dataclass
class Journal:
    """One execution's record of the agent's calls: what is given back, what runs now."""

    ex: Execution
    agent: PydanticAIAgent
    responses: dict[int, dict[str, Any]] = field(default_factory=dict)  # request -> response
    requests: int = 0  # model requests made so far in this execution of the agent
    # (model request, tool call id) -> step index: ids are unique within one response only
    indexes: dict[tuple[int, str], int] = field(default_factory=dict)
    visited: set[int] = field(default_factory=set)  # steps the agent asked for this time
    started: set[int] = field(default_factory=set)  # started by this execution, not yet run
    approved: dict[int, Approval] = field(default_factory=dict)  # decided, not yet consumed
    # What needs no commit of its own (a model's response, a step's start, a call's result):
    # committed with the next commit, before anything goes out (that commit is gated).
    open: Plan | None = None
    result_open: bool = False  # it holds a call's outcome (a tool's start is not folded in)

    def __post_init__(self) -> None:
        g = run_greenlet()
        self.blocking = g.blocking if g is not None else None
        self.responses = {
            int(payload["request"]): payload["response"] for payload in Event.objects.filter(
                run_id=self.ex.run.pk, kind="llm.responded").order_by("seq")
            .values_list("payload", flat=True) if "response" in payload}

    def plan(self) -> Plan:
        """The plan to add to: what waits for the next commit, else a new one."""
        plan, self.open, self.result_open = self.open or self.ex.plan(), None, False
        return plan

    def keep(self, plan: Plan) -> None:
        """Commit ``plan`` with the next commit: nothing outside waits on it."""
        self.open = plan

    def flush(self) -> None:
        """Commit what waits, before a rule that makes its own plan (recovery's)."""
        if self.open is not None:
            self.ex.commit(self.plan())

    # -- before the agent runs ----------------------------------------------------------------

    def recover(self) -> bool:
        """Settle every unfinished step (the interruption contract, decided approvals); False
        when the run paused or ended doing so."""
        ex = self.ex
        for step in list(ex.steps):
            if step.status in _FINISHED or _undecided(step):  # (decided again when asked)
                continue
            approval = (Approval.objects.filter(step_id=step.pk, status=ApprovalStatus.APPROVED)
                        .order_by("-pk").first())
            if approval is not None:
                self.approved[step.index] = approval
            elif step.status in (StepStatus.EXECUTING, StepStatus.INTERRUPTED):
                if interrupted(ex, step) is None:
                    return False
                self.started.add(step.index)
            elif step.status == StepStatus.WAITING:  # no decision yet: ask the policy again
                if _asked_for_approval(step):  # (the agent's own requires_approval)
                    self.agent.needs_approval.add(step.tool)
                tool = ex.agent.tool_for_step(step) if ex.agent else None
                assert tool is not None, "a Pydantic AI agent knows every recorded tool"
                if ex.gate_and_start(ex.plan(), step, tool) is None:
                    return False
                self.started.add(step.index)
            else:
                plan = ex.plan()
                ex.fail(plan, FailureCode.ERROR,
                        f"step {step.index} is {step.status}; cannot continue")
                ex.commit(plan)
                return False
        return True

    async def sync(self, fn: Callable[[], R]) -> R:
        """``fn()`` as the run's synchronous code (its commits as any run's), awaited."""
        return await run_in_greenlet(fn, blocking=self.blocking)

    # -- model requests -----------------------------------------------------------------------

    async def model_request(self, request_context: Any,
                            handler: Callable[[Any], Awaitable[ModelResponse]]) -> ModelResponse:
        self.requests += 1
        number = self.requests
        if number in self.responses:
            return T.validate_python(self.responses[number])
        await self.sync(lambda: self._requesting(number))
        try:
            response = await handler(request_context)
        except ModelRetry:
            raise
        except Exception as exc:
            await self.sync(partial(self._request_failed, exc))
            raise AssertionError("unreachable: a failed request ends the run") from None
        await self.sync(lambda: self._responded(number, response))
        return response

    def _requesting(self, number: int) -> None:
        ex = self.ex
        self._stop_if_asked()
        over = ex.llm_budget_error()
        if over:
            self._fail(over, FailureCode.BUDGET_EXCEEDED)
        plan = self.plan()
        index = len(ex.steps) + 1  # the step this request decides, if it asks for a call
        plan.event("llm.requested", {"request": number})
        plan.run["llm_requests"] = Add(1)
        ex.llm_requests += 1
        plan.crash_after(CrashPoint.AFTER_STEP_STARTED, index)
        ex.commit(plan)  # gated: the request goes out only under a live, unexpired lease
        crashpoints.reached(CrashPoint.DURING_LLM_REQUEST, run_id=ex.run.pk, step_index=index)
        connection_release()  # the model's wait holds no connection of the database's

    def _request_failed(self, exc: Exception) -> None:
        plan = self.plan()
        message = f"{type(exc).__name__}: {exc}"
        plan.event("llm.failed", {"error": message, "attempt": 1, "retryable": False})
        self.ex.fail(plan, FailureCode.ERROR, f"LLM request failed: {message}")
        self.ex.commit(plan)
        raise Halt

    def _responded(self, number: int, response: ModelResponse) -> None:
        ex = self.ex
        try:
            recorded = check_payload("model response", T.dump_python(response, mode="json"))
        except InvalidPayload as exc:
            self._fail(str(exc))
        plan = self.plan()
        usage = response.usage
        cost = _cost(response)
        plan.event("llm.responded", {
            "request": number, "tokens_in": usage.input_tokens,
            "tokens_out": usage.output_tokens, "cost": str(cost),
            "decisions": sum(1 for p in response.parts if p.part_kind == "tool-call"),
            "response": recorded})
        plan.run.update(tokens_in=Add(usage.input_tokens), tokens_out=Add(usage.output_tokens),
                        cost=Add(cost))
        ex.tokens += usage.input_tokens + usage.output_tokens
        ex.cost += cost
        over = ex.usage_budget_error()
        if over:
            ex.fail(plan, FailureCode.BUDGET_EXCEEDED, over)
            ex.commit(plan)
            raise Halt
        self.keep(plan)  # durable with the call it asks for, or the run's end
        self.responses[number] = recorded

    # -- tool calls ---------------------------------------------------------------------------

    async def tool_call(self, ctx: Any, call: Any, tool_def: Any, args: Any,
                        handler: Callable[[Any], Awaitable[Any]]) -> Any:
        index = self._index_for(call)
        step = self._recorded(index, call)
        if step is not None and step.status in _FINISHED:
            return _replayed(step)
        step = await self.sync(lambda: self._start(index, call, tool_def, step))
        while True:
            runtime_ctx = ToolContext(
                self.ex.run.pk, step.index, step.attempt, step.idempotency_key,
                self.agent.name, _on_dispatch=lambda: self.ex.record_dispatch(step))
            token = _call.set(runtime_ctx)
            result, error, retry = None, "", None
            try:
                result = await handler(args)
            except CallOutcomeUnknown as exc:  # as if the process had died mid-call
                await self.sync(partial(self._interrupted, step, exc.reason))
                continue
            except ToolRetryError as exc:  # the tool's ModelRetry: recorded, raised again
                retry = exc
                error = f"{_RETRY}{exc}"
            except (ToolFailed, LeaseLost):
                raise
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            finally:
                _call.reset(token)
            break
        await self.sync(lambda: self._finished(step, result, error, retry))
        return _replayed(step) if error else result

    def _index_for(self, call: Any) -> int:
        """The step of a tool call: each call the agent makes takes the next index, the first
        time it is seen (the same order on every execution of a deterministic agent)."""
        key = (self.requests, call.tool_call_id)  # the calls of the latest response
        index = self.indexes.get(key)
        if index is None:
            index = self.indexes[key] = len(self.indexes) + 1
        self.visited.add(index)
        return index

    def _recorded(self, index: int, call: Any) -> Step | None:
        if index > len(self.ex.steps):
            return None
        step = self.ex.steps[index - 1]
        arguments = call.args_as_dict()
        if step.tool and (step.tool != call.tool_name or (step.arguments or {}) != arguments):
            raise ReplayDiverged(self.ex.run.pk, index, f"{step.tool}({step.arguments})",
                                 f"{call.tool_name}({arguments})")
        return step

    def _start(self, index: int, call: Any, tool_def: Any, step: Step | None) -> Step:
        """Start the call's step: a new one through policy, an approved one by consuming its
        approval, one restarted by recovery as it is. Halts when the run pauses or ends."""
        ex = self.ex
        if step is None or _undecided(step):
            started = self._decide(index, call, tool_def, step)
        elif index in self.started:  # started ahead (recovery, a batch of approvals): what
            self.started.discard(index)  # came before is made durable, the lease checked
            self.flush()
            ex.check_lease()
            started = step
        elif index in self.approved:
            self.flush()
            started = consume(ex, step, self.approved.pop(index))
        else:  # an unfinished step nobody settled: as if found at a takeover
            self.flush()
            started = interrupted(ex, step)
        if started is None:
            raise Halt
        connection_release()  # the tool's wait holds no connection of the database's
        return started

    def _tool(self, call: Any, tool_def: Any) -> tuple[Any, str]:
        if tool_def is not None and tool_def.kind == "unapproved":
            self.agent.needs_approval.add(call.tool_name)
        return self.agent.tool_for(call.tool_name, getattr(tool_def, "metadata", None))

    def _decide(self, index: int, call: Any, tool_def: Any, step: Step | None) -> Step | None:
        """Record the agent's call as step ``index`` and put it through policy, as a native
        run does: the step's start, its decision and the tool's start (or the pause) in one
        commit, with the model's response that asked for it. A step left with no tool (a
        pause writes the step first) is decided again. Returns the started step, or None when
        the run paused or ended."""
        ex = self.ex
        if self.result_open:  # a call's outcome is its own commit before another call starts
            self.flush()
        self._stop_if_asked()
        limit = self.agent.budget.max_steps
        if index > limit:
            self._fail(f"step {index} would exceed the budget of {limit} steps",
                       FailureCode.BUDGET_EXCEEDED)
        try:
            arguments = check_payload("tool arguments", call.args_as_dict())
        except InvalidPayload as exc:
            self._fail(str(exc))
        plan = self.plan()
        if step is None:  # its start is committed with its decision
            assert index == len(ex.steps) + 1, "steps are recorded in the order they are called"
            key = step_idempotency_key(ex.run.pk, ex.run.created_at, index)
            step = new_step(run_id=ex.run.pk, index=index, status=StepStatus.DECIDING,
                            idempotency_key=key, started_at=plan.at)
            plan.event("step.started", {"idempotency_key": key}, index)
            plan.step_insert(step)
            ex.steps.append(step)
        tool, source = self._tool(call, tool_def)
        decided = plan.event("step.decided", {
            "tool": call.tool_name, "arguments": arguments, "effect": tool.effect,
            "effect_source": source, "idempotency_key": step.idempotency_key}, index)
        if call.tool_name in self.agent.needs_approval:
            decided["requires_approval"] = True
        plan.step_update(step, status=StepStatus.DECIDING, tool=call.tool_name,
                         arguments=arguments, effect=tool.effect)
        plan.crash_after(CrashPoint.AFTER_STEP_DECIDED, index)
        return ex.gate_and_start(plan, step, tool)

    def _interrupted(self, step: Step, why: str) -> None:
        """The tool could not tell whether its call took effect: the contract decides."""
        self.flush()
        if interrupted(self.ex, step, why) is None:
            raise Halt

    def _finished(self, step: Step, result: Any, error: str,
                  retry: ToolRetryError | None = None) -> None:
        ex = self.ex
        crashpoints.reached(CrashPoint.AFTER_TOOL_EFFECT, run_id=ex.run.pk,
                            step_index=step.index)
        if not error:
            try:
                result = check_payload(f"result of {step.tool}",
                                       pydantic_core.to_jsonable_python(result))
            except (InvalidPayload, pydantic_core.PydanticSerializationError) as exc:
                result, error = None, str(exc)
        plan = self.plan()
        payload = ex.record_outcome(plan, step, result, error)
        if retry is not None:  # what the model is told, given back as it was on replay
            told = payload["retry"] = PARTS.dump_python(retry.tool_retry, mode="json")
            plan.step_update(step, result=told)
        self.keep(plan)  # durable with the next request, or the run's end
        self.result_open = True

    # -- approvals the agent asks for (``requires_approval``) ---------------------------------

    async def deferred(self, ctx: Any, requests: Any) -> DeferredToolResults | None:
        if requests.calls:
            return None  # external calls are the caller's to make: the agent's own output
        answers: dict[str, Any] = {}
        for call in requests.approvals:
            index = self._index_for(call)
            step = self._recorded(index, call)
            if step is None or _undecided(step) or not (
                    step.status in _FINISHED or index in self.started or index in self.approved):
                tool_def = ctx.tool_manager.get_tool_def(call.tool_name) if ctx.tool_manager \
                    else None
                await self.sync(partial(self._ask, index, call, tool_def, step))
            answers[call.tool_call_id] = ToolApproved()
        return DeferredToolResults(approvals=answers)

    def _ask(self, index: int, call: Any, tool_def: Any, step: Step | None) -> None:
        """Put a call the agent wants approved before a person (the policy may allow it ahead
        of time with a standing authorization, or deny it)."""
        self.agent.needs_approval.add(call.tool_name)
        if step is None or _undecided(step):
            started = self._decide(index, call, tool_def, step)
        else:
            tool = self.agent.tool_for_step(step)
            assert tool is not None, "a Pydantic AI agent knows every recorded tool"
            started = self.ex.gate_and_start(self.plan(), step, tool)
        if started is None:
            raise Halt
        self.started.add(index)

    def check_all_replayed(self) -> None:
        """The agent ended without asking for a recorded call (its tools changed, a server
        was down): its answer cannot be trusted to account for that call."""
        missed = [s for s in self.ex.steps if s.index not in self.visited and s.tool]
        if missed:
            step = missed[0]
            raise ReplayDiverged(self.ex.run.pk, step.index, f"{step.tool}({step.arguments})",
                                 "no such call before its answer")

    # -- shared -------------------------------------------------------------------------------

    def _stop_if_asked(self) -> None:
        self.ex.check_lease()
        if self.ex.should_stop():
            self.ex.stop_here(self.plan())
            raise Halt

    def _fail(self, message: str, code: str = FailureCode.ERROR) -> None:
        plan = self.plan()
        self.ex.fail(plan, code, message)
        self.ex.commit(plan)
        raise Halt


def _undecided(step: Step) -> bool:
    """A step whose call never started and waits for no person: its decision was lost (a
    crash between a step's record and its pause), so it is decided again."""
    return not step.tool or (step.attempt == 0 and step.status in (
        StepStatus.DECIDING, StepStatus.INTERRUPTED))


def _asked_for_approval(step: Step) -> bool:
    """Whether the step's call was one the agent itself wants approved."""
    payload = (Event.objects.filter(run_id=step.run_id, step_index=step.index,
                                    kind="step.decided")
               .order_by("-seq").values_list("payload", flat=True).first())
    return bool((payload or {}).get("requires_approval"))


def _replayed(step: Step) -> Any:
    """A finished step's outcome as the tool gave it: its result, or its failure raised."""
    if step.status == StepStatus.SUCCEEDED:
        return step.result
    if step.error.startswith(_RETRY) and isinstance(step.result, dict):
        raise ToolRetryError(PARTS.validate_python(step.result))
    raise ToolFailed(step.error)


def _cost(response: ModelResponse) -> Decimal:
    """The response's price where Pydantic AI knows the model's prices, else nothing."""
    try:
        return Decimal(str(response.cost().total_price))
    except Exception:
        return Decimal("0")
