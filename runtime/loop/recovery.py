"""Where a resumed run picks up: the interruption contract (design §7) and approval consumption.

The runtime never runs an interrupted side-effect step again on its own, except when the tool's
own ``ctx.dispatch()`` record proves the call never went out. An agent's ``reconcile`` that
finds no effect and answers ``Continue`` re-runs the call only when the interrupted attempt can
no longer land: its worker proved dead, or its dispatch never recorded. A worker that merely
lost its lease (its host cut off from the database, or paused) may still be inside the call,
and its call may take effect after the reconciler looked; that question goes to a person.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.agents.reconcile import Complete, Conflict, Continue, ReconcileView, Wait
from runtime.agents.tools import Tool
from runtime.canonical import check_payload, request_digest
from runtime.effects import Effect
from runtime.errors import InvalidArguments, InvalidPayload
from runtime.loop.execution import AGENT_LOADED, Execution, restored_presentation
from runtime.models import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    Event,
    FailureCode,
    Step,
    StepStatus,
)
from runtime.storage.plan import Plan, interrupt_step

TOOL_OR_PROBLEM = "_tool_for gives a tool or a problem"


def recover(ex: Execution) -> Step | None:
    """Commit whatever comes first after the lease was taken; return the step to work on."""
    last = ex.steps[-1] if ex.steps else None
    if last is None:
        return ex.begin_step(ex.plan(), 1)
    if last.status in (StepStatus.SUCCEEDED, StepStatus.FAILED) and last.tool:
        return ex.begin_step(ex.plan(), last.index + 1)
    if last.status == StepStatus.DECIDING or (last.status == StepStatus.INTERRUPTED
                                              and not last.tool):
        return redecide(ex, last)
    if last.status in (StepStatus.WAITING, StepStatus.INTERRUPTED, StepStatus.EXECUTING):
        approval = (Approval.objects.filter(step_id=last.pk, status=ApprovalStatus.APPROVED)
                    .order_by("-pk").first())
        if approval is not None:
            return consume(ex, last, approval)
        if last.status == StepStatus.WAITING:  # no decision yet: ask the policy again
            plan = ex.plan()
            return _with_tool(ex, plan, last, lambda tool: ex.gate_and_start(plan, last, tool))
        return interrupted(ex, last)
    plan = ex.plan()  # a final or rejected step in a run that is not finished: refuse to guess
    ex.fail(plan, FailureCode.ERROR, f"step {last.index} is {last.status}; cannot continue")
    ex.commit(plan)
    return None


def redecide(ex: Execution, step: Step) -> Step | None:
    """A step interrupted (or released) while deciding is simply decided again."""
    plan = ex.plan()
    if step.status != StepStatus.DECIDING:  # the status changes on the record, as every change
        plan.step_update(step, status=StepStatus.DECIDING)
        plan.event("step.started", {"idempotency_key": step.idempotency_key, "again": True},
                   step.index)
    if ex.planned:
        if plan.events:
            ex.commit(plan)
        return step
    over = ex.llm_budget_error()
    if over:
        ex.fail_step(plan, step, FailureCode.BUDGET_EXCEEDED, over)
        return None
    ex.request_llm(plan, step)
    ex.commit(plan)
    return step


def interrupted(ex: Execution, step: Step, why: str = "") -> Step | None:
    """Design §7: reconcile if the agent can; else re-run reads, and put side effects to a
    person unless the dispatch record proves the call never went out. ``why``: the tool
    itself could not tell whether its call took effect (``CallOutcomeUnknown``)."""
    plan = ex.plan()
    if why:
        plan.event("step.outcome_unknown", {"reason": why, "attempt": step.attempt},
                   step.index)
    if step.status == StepStatus.EXECUTING:  # released mid-call by a stopping worker
        interrupt_step(plan, step)
    assert ex.agent is not None, AGENT_LOADED
    if ex.run.restored_at is not None:  # no proof from before the restore is trusted after it
        return _with_tool(ex, plan, step, lambda tool: (
            ex.pause_restored(plan, step) if ex.held_by_restore(step, tool)
            else _run_again(ex, plan, step, tool)))
    if ex.agent.reconcile is not None:
        outcome, held = _ask_reconcile(ex, plan, step)
        if outcome is not None:
            return _apply_outcome(ex, plan, step, outcome, held)
    tool, problem = _tool_for(ex, step)
    if problem:
        return _conflict(ex, plan, step, problem)
    assert tool is not None, TOOL_OR_PROBLEM
    if step.effect == Effect.READ_ONLY and tool.effect == Effect.READ_ONLY:
        return _run_again(ex, plan, step, tool)
    if step.dispatches and tool.dispatches and step.dispatched_attempt != step.attempt:
        plan.event("side_effect.auto_confirmed", {
            "reason": "the tool records ctx.dispatch() before its outbound call and no "
                      f"dispatch was recorded for attempt {step.attempt}: the call never went out",
            "attempt": step.attempt}, step.index)
        return ex.start_tool(plan, step, tool, after="interruption",
                             authorized_by="dispatch proof")
    title, detail = _interrupted_presentation(step, why)
    ex.pause(plan, step, ApprovalKind.INTERRUPTED_SIDE_EFFECT, title, detail,
             StepStatus.INTERRUPTED)
    return None


def consume(ex: Execution, step: Step, approval: Approval) -> Step | None:
    """An approved request starts once more: same step, same schema check, policy again. A
    policy call a person edited runs as edited: the step's request is the effective one."""
    plan = ex.plan()
    if (approval.effective_digest or approval.digest) != request_digest(
            step.tool, step.arguments, step.effect):
        ex.cancel_approval(plan, approval, "stale: the step's request changed")
        title, detail = _presentation_for(ex, approval.kind, step)
        ex.pause(plan, step, approval.kind, title, detail, step.status)
        return None
    tool, problem = _tool_for(ex, step)
    if problem:
        ex.cancel_approval(plan, approval, problem)
        return _conflict(ex, plan, step, problem)
    assert tool is not None, TOOL_OR_PROBLEM
    return ex.gate_and_start(plan, step, tool, approval)


def _run_again(ex: Execution, plan: Plan, step: Step, tool: Tool, **why: Any) -> Step | None:
    """Start an interrupted step's tool once more, unless a read-only tool hit its cap."""
    capped = ex.attempt_cap_error(step, tool)
    if capped:
        ex.fail(plan, FailureCode.ERROR, capped)
        ex.commit(plan)
        return None
    return ex.start_tool(plan, step, tool, after="interruption", **why)


def _presentation_for(ex: Execution, kind: str, step: Step) -> tuple[str, str]:
    """Text for a fresh approval of ``step``'s request as it stands now."""
    if kind == ApprovalKind.POLICY:
        return (f"Allow {step.tool}?",
                "The request changed since it was last allowed; decide on it as it is now.")
    if kind == ApprovalKind.RESTORED:
        return restored_presentation(ex.run, step)
    return _interrupted_presentation(step)


def _with_tool(ex: Execution, plan: Plan, step: Step,
               then: Callable[[Tool], Step | None]) -> Step | None:
    tool, problem = _tool_for(ex, step)
    if problem:
        return _conflict(ex, plan, step, problem)
    assert tool is not None, TOOL_OR_PROBLEM
    return then(tool)


def _tool_for(ex: Execution, step: Step) -> tuple[Tool | None, str]:
    """The step's tool, or None and why it cannot run again (never both, never neither)."""
    assert ex.agent is not None, AGENT_LOADED
    tool = ex.agent.tool_for_step(step)
    if tool is None:
        return None, f"tool {step.tool!r} is no longer registered for agent {ex.agent.name!r}"
    try:
        tool.validate(step.arguments)
    except InvalidArguments as exc:
        return None, f"the recorded arguments no longer pass the tool's schema: {exc.errors}"
    return tool, ""


def _conflict(ex: Execution, plan: Plan, step: Step, reason: str) -> Step | None:
    """End the run ``reconcile_conflict``: no step to work on (None, as every step function
    here answers when the run stops)."""
    plan.event("reconcile.decided", {"outcome": "conflict", "by": "runtime", "reason": reason},
               step.index)
    ex.fail(plan, FailureCode.RECONCILE_CONFLICT, reason)
    ex.commit(plan)
    return None


def call_may_still_land(step: Step, events: list[Event]) -> str:
    """Why the interrupted attempt's call may still take effect from now on, or "" if it
    cannot: it never started, it only read, its dispatch was never recorded (a dispatch after
    the takeover is fenced off), or the worker that started it was proved dead."""
    if step.effect != Effect.SIDE_EFFECT or step.attempt == 0:
        return ""
    if step.dispatches and step.dispatched_attempt != step.attempt:
        return ""
    last = next((e for e in reversed(events) if e.kind == "step.interrupted"
                 and e.step_index == step.index), None)
    if last is not None and (last.payload.get("was") != StepStatus.EXECUTING
                             or last.payload.get("previous_owner_dead")):
        return ""
    who = (last.payload.get("previous_owner") if last is not None else "") or (
        "the worker that ran it")
    return (f"{who} lost the run without being proved dead (a host cut off from the database, "
            f"a paused machine, or a worker stopping): its call of attempt {step.attempt} may "
            "still be under way and take effect after the reconcile looked")


def _ask_reconcile(ex: Execution, plan: Plan, step: Step) -> tuple[Any, str]:
    """The agent's answer (None: it could not tell) and why the call may still land."""
    assert ex.agent is not None and ex.agent.reconcile is not None, "asked only if it has one"
    events = list(Event.objects.filter(run_id=ex.run.pk).order_by("seq"))
    view = ReconcileView(
        run=ex.run, steps=list(ex.steps), events=events,
        step=step, tool=step.tool, arguments=step.arguments or {}, effect=step.effect,
        idempotency_key=step.idempotency_key, attempt=step.attempt,
        dispatched=step.attempt > 0 and step.dispatched_attempt == step.attempt,
        may_still_land=call_may_still_land(step, events))
    try:
        outcome = ex.agent.reconcile(view)
        if not isinstance(outcome, Continue | Complete | Wait | Conflict):
            raise TypeError(f"reconcile returned {outcome!r}")
        return outcome, view.may_still_land
    except Exception as exc:  # the consumer could not tell: fall back to the default contract
        plan.event("reconcile.decided", {"outcome": "error", "error": f"{type(exc).__name__}: "
                                         f"{exc}", "fallback": "default contract"}, step.index)
        return None, view.may_still_land


def _apply_outcome(ex: Execution, plan: Plan, step: Step, outcome: Any,
                   held: str) -> Step | None:
    idx = step.index
    if isinstance(outcome, Conflict):
        plan.event("reconcile.decided", {"outcome": "conflict", "reason": outcome.reason}, idx)
        ex.fail(plan, FailureCode.RECONCILE_CONFLICT, outcome.reason)
        ex.commit(plan)
        return None
    if isinstance(outcome, Wait):
        plan.event("reconcile.decided", {"outcome": "wait", "title": outcome.title}, idx)
        ex.pause(plan, step, ApprovalKind.RECONCILE, outcome.title, outcome.detail,
                 StepStatus.INTERRUPTED)
        return None
    if isinstance(outcome, Complete):
        try:
            result = check_payload("reconciled result", outcome.result)
        except InvalidPayload as exc:
            return _conflict(ex, plan, step, f"reconcile completed with a bad result: {exc}")
        plan.event("reconcile.decided", {"outcome": "complete", "result": result}, idx)
        plan.event("step.tool_finished", {"result": result, "attempt": step.attempt,
                                          "recovered_by": "reconcile"}, idx)
        plan.step_update(step, status=StepStatus.SUCCEEDED, result=result, finished_at=plan.at)
        ex.remember(step)
        return ex.begin_step(plan, idx + 1)
    if held:
        plan.event("reconcile.decided", {"outcome": "continue", "held": held}, idx)
        ex.pause(plan, step, ApprovalKind.RECONCILE, f"Run {step.tool} again?",
                 f"The agent's reconcile found no effect of attempt {step.attempt} and would "
                 f"run the call again, but {held}. Approve to run it once more, resolve with "
                 "its result if it did take effect, or reject to end the run.",
                 StepStatus.INTERRUPTED)
        return None
    plan.event("reconcile.decided", {"outcome": "continue"}, idx)
    tool, problem = _tool_for(ex, step)
    if problem:
        return _conflict(ex, plan, step, problem)
    assert tool is not None, TOOL_OR_PROBLEM
    return _run_again(ex, plan, step, tool, authorized_by="reconcile")


def _interrupted_presentation(step: Step, why: str = "") -> tuple[str, str]:
    started = (Event.objects.filter(run_id=step.run_id, step_index=step.index,
                                    kind="step.tool_started").order_by("-seq").first())
    when = started.at.isoformat(timespec="seconds") if started else "an unknown time"
    who = started.actor if started else "an unknown owner"
    title = f"{step.tool} was interrupted: did it take effect?"
    # The page shows the arguments, the key and what each decision does; this says what
    # happened, which nothing else on it does.
    detail = (
        f"The call to {step.tool} ({step.effect}) started at {when}, attempt {step.attempt}, "
        f"run by {who}, and "
        f"{why or 'the process stopped before its outcome was recorded'}, so whether "
        "it took effect is unknown. Check the outside world for its idempotency key."
    )
    return title, detail
