"""Where a resumed run picks up: the interruption contract (design §7) and approval consumption.

The runtime never runs an interrupted side-effect step again on its own, except when the tool's
own ``ctx.dispatch()`` record proves the call never went out.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .canonical import check_payload, request_digest
from .errors import InvalidArguments, InvalidPayload
from .models import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    Event,
    FailureCode,
    Step,
    StepStatus,
)
from .reconcile import Complete, Conflict, Continue, ReconcileView, Wait
from .tools import Tool

if TYPE_CHECKING:
    from .driver import Execution, Tx


def recover(ex: Execution) -> Step | None:
    """Commit whatever comes first after the lease was taken; return the step to work on."""
    last = ex.steps[-1] if ex.steps else None
    if last is None:
        return ex.begin_step(ex.tx(), 1)
    if last.status in (StepStatus.SUCCEEDED, StepStatus.FAILED) and last.tool:
        return ex.begin_step(ex.tx(), last.index + 1)
    if last.status == StepStatus.DECIDING or (last.status == StepStatus.INTERRUPTED
                                              and not last.tool):
        return redecide(ex, last)
    if last.status in (StepStatus.WAITING, StepStatus.INTERRUPTED, StepStatus.EXECUTING):
        approval = (Approval.objects.filter(step_id=last.pk, status=ApprovalStatus.APPROVED)
                    .order_by("-pk").first())
        if approval is not None:
            return consume(ex, last, approval)
        if last.status == StepStatus.WAITING:  # no decision yet: ask the policy again
            tx = ex.tx()
            return _with_tool(ex, tx, last, lambda tool: ex.gate_and_start(tx, last, tool))
        return interrupted(ex, last)
    tx = ex.tx()  # a final or rejected step in a run that is not finished: refuse to guess
    ex.fail(tx, FailureCode.ERROR, f"step {last.index} is {last.status}; cannot continue")
    ex.commit(tx)
    return None


def redecide(ex: Execution, step: Step) -> Step | None:
    """A step interrupted (or released) while deciding is simply decided again."""
    tx = ex.tx()
    if step.status != StepStatus.DECIDING:  # the status changes on the record, as every change
        tx.step_update(step, status=StepStatus.DECIDING)
        tx.event("step.started", {"idempotency_key": step.idempotency_key, "again": True},
                 step.index)
    if ex.planned:
        if tx.writes:
            ex.commit(tx)
        return step
    budget = ex.agent.budget
    if ex.llm_requests + 1 > budget.max_llm_requests:
        message = (f"LLM request {ex.llm_requests + 1} would exceed the budget of "
                   f"{budget.max_llm_requests}")
        tx.step_update(step, status=StepStatus.FAILED, error=message, finished_at=tx.now)
        ex.fail(tx, FailureCode.BUDGET_EXCEEDED, message)
        ex.commit(tx)
        return None
    ex.request_llm(tx, step)
    ex.commit(tx)
    ex.llm_requests += 1
    return step


def interrupted(ex: Execution, step: Step) -> Step | None:
    """Design §7: reconcile if the agent can; else re-run reads, and put side effects to a
    person unless the dispatch record proves the call never went out."""
    tx = ex.tx()
    if step.status == StepStatus.EXECUTING:  # released mid-call by a stopping worker
        tx.event("step.interrupted", {"was": step.status, "tool": step.tool,
                                      "attempt": step.attempt}, step.index)
        tx.step_update(step, status=StepStatus.INTERRUPTED)
    if ex.agent.reconcile is not None:
        outcome = _ask_reconcile(ex, tx, step)
        if outcome is not None:
            return _apply_outcome(ex, tx, step, outcome)
    tool, problem = _tool_for(ex, step)
    if problem:
        return _conflict(ex, tx, step, problem)
    if step.effect == "read_only" and tool.effect == "read_only":
        if step.attempt >= tool.max_attempts:
            ex.fail(tx, FailureCode.ERROR, f"read-only tool {tool.name} was interrupted "
                    f"{step.attempt} times (its cap is {tool.max_attempts})")
            ex.commit(tx)
            return None
        return ex.start_tool(tx, step, tool, after="interruption")
    if step.dispatches and tool.dispatches and step.dispatched_attempt != step.attempt:
        tx.event("side_effect.auto_confirmed", {
            "reason": "the tool records ctx.dispatch() before its outbound call and no "
                      f"dispatch was recorded for attempt {step.attempt}: the call never went out",
            "attempt": step.attempt}, step.index)
        return ex.start_tool(tx, step, tool, after="interruption", authorized_by="dispatch proof")
    title, detail = _interrupted_presentation(step)
    ex.pause(tx, step, ApprovalKind.INTERRUPTED_SIDE_EFFECT, title, detail,
             StepStatus.INTERRUPTED)
    return None


def consume(ex: Execution, step: Step, approval: Approval) -> Step | None:
    """An approved request starts once more: same step, same schema check, policy again."""
    tx = ex.tx()
    if approval.digest != request_digest(step.tool, step.arguments, step.effect):
        ex.cancel_approval(tx, approval, "stale: the step's request changed")
        title, detail = _presentation_for(approval.kind, step)
        ex.pause(tx, step, approval.kind, title, detail, step.status)
        return None
    tool, problem = _tool_for(ex, step)
    if problem:
        ex.cancel_approval(tx, approval, problem)
        return _conflict(ex, tx, step, problem)
    return ex.gate_and_start(tx, step, tool, approval)


def _presentation_for(kind: str, step: Step) -> tuple[str, str]:
    """Text for a fresh approval of ``step``'s request as it stands now."""
    if kind == ApprovalKind.POLICY:
        return (f"Approve {step.tool}?",
                f"The request changed since it was last approved.\n\nArguments: "
                f"{json.dumps(step.arguments, indent=2, sort_keys=True)}\n"
                f"Idempotency key: {step.idempotency_key}")
    return _interrupted_presentation(step)


def _with_tool(ex: Execution, tx: Tx, step: Step, then: Any) -> Step | None:
    tool, problem = _tool_for(ex, step)
    if problem:
        return _conflict(ex, tx, step, problem)
    return then(tool)


def _tool_for(ex: Execution, step: Step) -> tuple[Tool | None, str]:
    tool = ex.agent.tools.get(step.tool)
    if tool is None:
        return None, f"tool {step.tool!r} is no longer registered for agent {ex.agent.name!r}"
    try:
        tool.validate(step.arguments)
    except InvalidArguments as exc:
        return None, f"the recorded arguments no longer pass the tool's schema: {exc.errors}"
    return tool, ""


def _conflict(ex: Execution, tx: Tx, step: Step, reason: str) -> None:
    tx.event("reconcile.decided", {"outcome": "conflict", "by": "runtime", "reason": reason},
             step.index)
    ex.fail(tx, FailureCode.RECONCILE_CONFLICT, reason)
    ex.commit(tx)
    return None


def _ask_reconcile(ex: Execution, tx: Tx, step: Step) -> Any:
    view = ReconcileView(
        run=ex.run, steps=list(ex.steps),
        events=list(Event.objects.filter(run_id=ex.run.pk).order_by("seq")),
        step=step, tool=step.tool, arguments=step.arguments or {}, effect=step.effect,
        idempotency_key=step.idempotency_key, attempt=step.attempt,
        dispatched=step.attempt > 0 and step.dispatched_attempt == step.attempt)
    try:
        outcome = ex.agent.reconcile(view)
        if not isinstance(outcome, Continue | Complete | Wait | Conflict):
            raise TypeError(f"reconcile returned {outcome!r}")
        return outcome
    except Exception as exc:  # the consumer could not tell: fall back to the default contract
        tx.event("reconcile.decided", {"outcome": "error", "error": f"{type(exc).__name__}: "
                                       f"{exc}", "fallback": "default contract"}, step.index)
        return None


def _apply_outcome(ex: Execution, tx: Tx, step: Step, outcome: Any) -> Step | None:
    idx = step.index
    if isinstance(outcome, Conflict):
        tx.event("reconcile.decided", {"outcome": "conflict", "reason": outcome.reason}, idx)
        ex.fail(tx, FailureCode.RECONCILE_CONFLICT, outcome.reason)
        ex.commit(tx)
        return None
    if isinstance(outcome, Wait):
        tx.event("reconcile.decided", {"outcome": "wait", "title": outcome.title}, idx)
        ex.pause(tx, step, ApprovalKind.RECONCILE, outcome.title, outcome.detail,
                 StepStatus.INTERRUPTED)
        return None
    if isinstance(outcome, Complete):
        try:
            result = check_payload("reconciled result", outcome.result)
        except InvalidPayload as exc:
            return _conflict(ex, tx, step, f"reconcile completed with a bad result: {exc}")
        tx.event("reconcile.decided", {"outcome": "complete", "result": result}, idx)
        tx.event("step.tool_finished", {"result": result, "attempt": step.attempt,
                                        "recovered_by": "reconcile"}, idx)
        tx.step_update(step, status=StepStatus.SUCCEEDED, result=result, finished_at=tx.now)
        ex.transcript.entries.append(_entry_of(step))
        return ex.begin_step(tx, idx + 1)
    tx.event("reconcile.decided", {"outcome": "continue"}, idx)
    tool, problem = _tool_for(ex, step)
    if problem:
        return _conflict(ex, tx, step, problem)
    if tool.effect == "read_only" and step.attempt >= tool.max_attempts:
        ex.fail(tx, FailureCode.ERROR, f"read-only tool {tool.name} was interrupted "
                f"{step.attempt} times (its cap is {tool.max_attempts})")
        ex.commit(tx)
        return None
    return ex.start_tool(tx, step, tool, after="interruption", authorized_by="reconcile")


def _entry_of(step: Step) -> Any:
    from .driver import _entry

    return _entry(step)


def _interrupted_presentation(step: Step) -> tuple[str, str]:
    started = (Event.objects.filter(run_id=step.run_id, step_index=step.index,
                                    kind="step.tool_started").order_by("-seq").first())
    when = started.at.isoformat(timespec="seconds") if started else "an unknown time"
    who = started.actor if started else "an unknown owner"
    title = f"{step.tool} was interrupted: did it take effect?"
    detail = (
        f"The call to {step.tool} ({step.effect}) started at {when}, attempt {step.attempt}, "
        f"run by {who}, and the process stopped before its outcome was recorded, so whether "
        f"it took effect is unknown.\n\n"
        f"Arguments: {json.dumps(step.arguments, indent=2, sort_keys=True)}\n"
        f"Idempotency key: {step.idempotency_key}\n\n"
        "Check the outside world for this key. Approve runs the same request once more "
        "(a second execution if the first took effect). Resolve records the result you found "
        "and continues. Reject ends the run without calling the tool again."
    )
    return title, detail
