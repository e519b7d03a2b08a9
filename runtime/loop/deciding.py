"""Deciding a step: asking the LLM (bounded retries with recorded backoff, usage charged to the
run, the budget checked before anything is decided), then applying its decision: a final
answer, a failed request, or a tool call put through policy."""

from __future__ import annotations

import inspect
import random
from decimal import Decimal
from typing import Any

from runtime import crashpoints
from runtime.agents.aio import call_blocking, run_awaitable
from runtime.agents.llm import Decision, FinalAnswer, LLMResponse, ToolCall
from runtime.canonical import check_payload, dumps
from runtime.conf import setting
from runtime.crashpoints import CrashPoint
from runtime.errors import InvalidArguments, InvalidPayload, LeaseLost, LLMError, ToolNotRegistered
from runtime.loop.execution import AGENT_LOADED, Execution
from runtime.models import FailureCode, Step, StepStatus
from runtime.storage.connections import connection_release
from runtime.storage.plan import Add, Plan

# The longest a wait before an LLM retry goes without checking the lease and should_stop.
_WAIT_SLICE = 0.2


def decide(ex: Execution, step: Step) -> Step | None:
    plan = ex.plan()
    if ex.planned:
        decision = _decision_from_json(ex.planned.pop(0))
        plan.run["planned"] = list(ex.planned)
        return apply_decision(ex, plan, step, decision)
    assert ex.agent is not None, AGENT_LOADED
    attempt = 1
    while True:
        ex.check_lease()
        if ex.should_stop():  # the step stays deciding; whoever claims it next decides it
            ex.stop_here(plan)
            return None
        crashpoints.reached(CrashPoint.DURING_LLM_REQUEST, run_id=ex.run.pk,
                            step_index=step.index)
        connection_release()  # the LLM's wait holds no connection of the database's
        try:
            response = ask(ex.agent.llm, ex.transcript, ex.agent.tool_specs)
            decisions = _checked_decisions(response)
            # Later decisions wait in the run row: each must be storable now, or the LLM's
            # answer fails like any other it gave that cannot be kept.
            planned = [_decision_to_json(d) for d in decisions[1:]]
            break
        except LeaseLost:
            raise
        except Exception as exc:
            if not llm_failed(ex, step, exc, attempt):
                return None
        attempt += 1
        plan = ex.plan()
    plan = ex.plan()
    usage = response.usage
    plan.event("llm.responded", {"tokens_in": usage.tokens_in, "tokens_out": usage.tokens_out,
                                 "cost": str(usage.cost), "decisions": len(decisions)},
               step.index)
    plan.run.update(tokens_in=Add(usage.tokens_in), tokens_out=Add(usage.tokens_out),
                    cost=Add(Decimal(usage.cost)))
    ex.tokens += usage.tokens_in + usage.tokens_out
    ex.cost += Decimal(usage.cost)
    ex.planned = planned
    plan.run["planned"] = list(ex.planned)
    over = ex.usage_budget_error()
    if over:
        ex.fail_step(plan, step, FailureCode.BUDGET_EXCEEDED, over)
        return None
    return apply_decision(ex, plan, step, decisions[0])


def ask(llm: Any, transcript: Any, tools: Any) -> Any:
    """The model's response: an async client's coroutine awaited (on the event-loop worker,
    on its loop), a sync client called where it may block (on that worker, its pool), unless
    it says it never waits (``blocks = False``)."""
    complete = llm.complete
    if getattr(llm, "blocks", True) and not inspect.iscoroutinefunction(complete):
        response = call_blocking(complete, transcript, tools)
    else:
        response = complete(transcript, tools)
    return run_awaitable(response) if inspect.isawaitable(response) else response


def apply_decision(ex: Execution, plan: Plan, step: Step, decision: Decision) -> Step | None:
    """Record what the LLM decided and act on it: finish, fail the step, or gate the tool."""
    idx = step.index
    if isinstance(decision, FinalAnswer):
        try:
            output = check_payload("final answer", decision.output)
        except InvalidPayload as exc:
            ex.fail_step(plan, step, FailureCode.ERROR, str(exc))
            return None
        plan.event("step.decided", {"final": True, "output": output}, idx)
        plan.step_update(step, status=StepStatus.SUCCEEDED, result=output, finished_at=plan.at)
        ex.finish(plan, output)
        plan.crash_after(CrashPoint.AFTER_STEP_DECIDED, idx)
        ex.commit(plan)
        return None
    assert ex.agent is not None, AGENT_LOADED
    tool = ex.agent.tools.get(decision.tool)
    error = ""
    try:
        arguments = check_payload("tool arguments", decision.arguments)
    except InvalidPayload as exc:
        arguments, error = None, str(exc)
    effect = tool.effect if tool is not None else ""
    plan.event("step.decided", {"tool": decision.tool, "arguments": arguments, "effect": effect,
                                "idempotency_key": step.idempotency_key}, idx)
    plan.step_update(step, tool=decision.tool, arguments=arguments, effect=effect)
    plan.crash_after(CrashPoint.AFTER_STEP_DECIDED, idx)
    if not error:
        try:
            if tool is None:
                raise ToolNotRegistered(ex.agent.name, decision.tool)
            ex.validated[idx] = tool.validate(arguments)  # the call's, if it starts here
        except (ToolNotRegistered, InvalidArguments) as exc:
            error = str(exc)
    if error:
        plan.event("step.tool_failed", {"error": error, "started": False}, idx)
        plan.step_update(step, status=StepStatus.FAILED, error=error, finished_at=plan.at)
        ex.remember(step)
        return ex.begin_step(plan, idx + 1)
    assert tool is not None, "an unregistered tool is an error"
    return ex.gate_and_start(plan, step, tool)

def llm_failed(ex: Execution, step: Step, exc: Exception, attempt: int) -> bool:
    """Record a failed LLM request; True once the same request may be sent again.

    A retryable ``LLMError`` gets up to ``llm.max_retries`` (else ``RUNTIME["LLM_RETRIES"]``,
    default 3) more attempts, each after its ``llm.failed`` is committed and a backoff has
    passed. A retry is the same request, not a new one: it is no new step, charges no
    usage and does not count toward ``Budget.max_llm_requests`` (the retry limit bounds
    it); its ``llm.requested`` carries the same request number and the attempt. Anything
    else, or the last allowed attempt failing, fails the step and the run (``error``).
    """
    retryable = isinstance(exc, LLMError) and exc.retryable
    message = str(exc) if isinstance(exc, LLMError) else f"{type(exc).__name__}: {exc}"
    payload: dict[str, Any] = {"error": message, "attempt": attempt, "retryable": retryable}
    if isinstance(exc, LLMError) and exc.status is not None:
        payload["status"] = exc.status
    plan = ex.plan()
    assert ex.agent is not None, AGENT_LOADED
    if not retryable or attempt > _llm_retries(ex.agent.llm):
        plan.event("llm.failed", payload, step.index)
        ex.fail_step(plan, step, FailureCode.ERROR, f"LLM request failed: {message}",
                     step_error=message)
        return False
    assert isinstance(exc, LLMError), "only an LLMError is retryable"
    delay = _retry_delay(attempt, exc.retry_after)
    plan.event("llm.failed", {**payload, "retry_in": delay}, step.index)
    ex.commit(plan)
    if not wait_before_retry(ex, delay):
        ex.stop_here(ex.plan())
        return False
    plan = ex.plan()
    plan.event("llm.requested", {"request": ex.llm_requests, "attempt": attempt + 1},
               step.index)
    ex.commit(plan)  # gated: the retry goes out only under a live, unexpired lease
    return True

def wait_before_retry(ex: Execution, seconds: float) -> bool:
    """Let ``seconds`` pass in short slices; False as soon as this process must stop.

    Raises ``LeaseLost`` when the heartbeat finds the lease gone, so nothing is sent.
    """
    remaining = seconds
    connection_release()
    while True:
        ex.check_lease()
        if ex.should_stop():
            return False
        if remaining <= 0:
            return True
        chunk = min(remaining, _WAIT_SLICE)
        ex.sleep(chunk)
        remaining -= chunk

def _llm_retries(llm: Any) -> int:
    limit = getattr(llm, "max_retries", None)
    return int(setting("LLM_RETRIES") if limit is None else limit)


def _retry_delay(attempt: int, retry_after: float | None) -> float:
    """Seconds before retry ``attempt + 1``: the server's ``Retry-After`` if it gave one, else
    exponential backoff with jitter; never more than ``RUNTIME["LLM_RETRY_MAX_SECONDS"]``."""
    cap = float(setting("LLM_RETRY_MAX_SECONDS"))
    if retry_after is None:
        base = float(setting("LLM_RETRY_BASE_SECONDS"))
        delay = base * 2 ** (attempt - 1) * random.uniform(0.5, 1.0)
    else:
        delay = retry_after
    return round(min(max(delay, 0.0), cap), 3)


def _checked_decisions(response: Any) -> list[Decision]:
    if not isinstance(response, LLMResponse):
        raise TypeError(f"the LLM returned {type(response).__name__}, not an LLMResponse")
    decisions = list(response.decisions)
    if not decisions:
        raise ValueError("the LLM returned no decision")
    for d in decisions:
        if not isinstance(d, ToolCall | FinalAnswer):
            raise TypeError(f"the LLM returned {d!r}, not a ToolCall or FinalAnswer")
        if isinstance(d, ToolCall):
            if not isinstance(d.arguments, dict):
                raise TypeError(f"the LLM gave {d.tool!r} arguments that are not an object")
            dumps(d.arguments)  # raises for values JSON cannot hold
    return decisions


def _decision_to_json(d: Decision) -> dict[str, Any]:
    if isinstance(d, FinalAnswer):
        return {"final": check_payload("final answer", d.output)}
    return {"tool": d.tool, "arguments": check_payload("tool arguments", d.arguments)}


def _decision_from_json(data: dict[str, Any]) -> Decision:
    if "final" in data:
        return FinalAnswer(data["final"])
    return ToolCall(data["tool"], data.get("arguments") or {})
