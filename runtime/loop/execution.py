"""One run while this process holds its lease: its state, and the transitions the loop commits.

Each transition adds to a ``Plan`` (events, row changes, crash points) and the plan is committed
once, fenced by the lease (``Execution.commit``). The contract's decisions are functions over an
``Execution`` in their own modules (``runtime.loop.deciding``, ``runtime.loop.recovery``); the
driver (``runtime.loop.driver``) runs the loop. This module imports none of them.

A steady-state step is two synced commits:
  1. ``llm.responded`` + ``step.decided`` + ``step.tool_started`` (before the tool runs),
  2. ``step.tool_finished`` + the next ``step.started`` + ``llm.requested`` (before the LLM call).
Whatever must be durable before an outside call is committed before it, never folded past it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any, cast

from runtime import crashpoints
from runtime.agents.agent import Agent
from runtime.agents.aio import pause
from runtime.agents.llm import Transcript, TranscriptEntry
from runtime.agents.policy import (
    Deny,
    Request,
    RequireApproval,
    default_expiry_seconds,
    expiry_seconds,
)
from runtime.agents.tools import Tool
from runtime.canonical import iso_time, request_digest, step_idempotency_key
from runtime.crashpoints import CrashPoint
from runtime.effects import Effect
from runtime.errors import AuthorizationWithdrawn, LeaseLost
from runtime.leasing.lease import Committer, Lease, lease_commit, lease_plan
from runtime.models import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    FailureCode,
    Run,
    RunStatus,
    Step,
    StepStatus,
    held_step_status,
)
from runtime.schedules.authorization import standing_authorization
from runtime.storage.connections import connection_release
from runtime.storage.plan import Add, ApprovalDraft, Plan, StandingGuard

_STEP_FIELDS = Step._meta.concrete_fields
_STEP_PLACES = {f.attname: i for i, f in enumerate(_STEP_FIELDS)}
_STEP_DEFAULTS = [f.get_default() for f in _STEP_FIELDS]
# Shared between steps only while no default can be changed in place (else made per step).
_DEFAULTS_FIXED = all(v is None or type(v) in (str, int, bool) for v in _STEP_DEFAULTS)

# Why ``Execution.agent`` is set wherever a step is worked on: ``run_loop`` loads it first
# (a run whose agent is unknown fails before any step).
AGENT_LOADED = "run_loop loads the agent before any step"


def new_step(**values: Any) -> Step:
    """``Step(**values)`` built through the model's positional path (a quarter of the cost of
    its keyword one, paid once a step): every other field at its default."""
    row = (list(_STEP_DEFAULTS) if _DEFAULTS_FIXED
           else [f.get_default() for f in _STEP_FIELDS])
    for name, value in values.items():
        row[_STEP_PLACES[name]] = value
    return Step(*row)


def restored_presentation(run: Run, step: Step) -> tuple[str, str]:
    """What a ``restored`` approval tells the person deciding it."""
    taken = (f"{run.restored_at:%Y-%m-%d %H:%M:%S} UTC" if run.restored_at is not None
             else "an unknown time")
    title = f"Restored from a backup taken at {taken}: did {step.tool} already happen?"
    detail = (
        f"The database was restored from a backup taken at {taken}. This run was not finished "
        "then and may have done more after it, this call included: the record of anything it "
        f"did after {taken} was lost. Check the outside world for the call to {step.tool} "
        f"({step.effect}) with idempotency key {step.idempotency_key}, then run it once more, "
        "record its result if it happened, or end the run. Each later side effect of this run "
        "asks again."
    )
    return title, detail


def entry(step: Step) -> TranscriptEntry:
    """What the LLM is shown of a finished step."""
    return TranscriptEntry(step.index, step.tool, step.arguments or {}, step.result, step.error)


class Execution:
    """The state of one run while this process holds its lease."""

    def __init__(self, lease: Lease, run: Run, agent: Agent | None, *, clock: Any,
                 should_stop: Callable[[], bool] | None = None, first_claim: bool = False,
                 sleep: Callable[[float], Any] = pause,
                 committer: Committer = lease_commit) -> None:
        self.lease, self.run, self.agent, self.clock = lease, run, agent, clock
        self.should_stop = should_stop or (lambda: False)
        self.sleep = sleep
        # Who executes this run's plans: ``lease_commit`` here, or the event-loop worker's
        # committer threads while the loop runs other runs (``runtime.worker.eventloop``).
        self.committer = committer
        # A run claimed for the first time has no steps yet: nothing to read.
        self.steps: list[Step] = [] if first_claim else list(
            Step.objects.filter(run_id=run.pk).order_by("index"))
        self.transcript = Transcript(run.pk, run.agent, run.input, [
            entry(s) for s in self.steps
            if s.tool and s.status in (StepStatus.SUCCEEDED, StepStatus.FAILED)
        ])
        self.planned: list[dict[str, Any]] = list(run.planned or [])
        self.llm_requests = run.llm_requests
        self.tokens = run.tokens_in + run.tokens_out
        self.cost = Decimal(run.cost)
        self.status: str = run.status  # as last committed by this execution
        # Step index -> its tool's validated arguments, from the decision to the call (a step
        # decided here is validated once).
        self.validated: dict[int, dict[str, Any]] = {}

    # -- committing ---------------------------------------------------------------------------

    def plan(self) -> Plan:
        return lease_plan(self.lease, self.clock.now())

    def check_lease(self) -> None:
        """Stop before an outside call once the heartbeat found the lease gone."""
        if self.lease.lost:
            raise LeaseLost(self.lease.run_id, self.lease.owner, "lease lost (heartbeat)")

    def commit(self, plan: Plan) -> None:
        if plan.gated:
            self.check_lease()
        self.committer(self.lease, plan, self.clock)
        self.status = plan.run.get("status", self.status)
        for point, step in plan.after:
            crashpoints.reached(point, run_id=self.run.pk, step_index=step)

    # -- the rules, each written once ----------------------------------------------------------

    def llm_budget_error(self) -> str:
        """Why one more LLM request would exceed the budget; empty if it would not."""
        assert self.agent is not None, AGENT_LOADED
        limit = self.agent.budget.max_llm_requests
        if self.llm_requests + 1 > limit:
            return f"LLM request {self.llm_requests + 1} would exceed the budget of {limit}"
        return ""

    def usage_budget_error(self) -> str:
        """Why the tokens or cost used so far exceed the budget; empty if they do not."""
        assert self.agent is not None, AGENT_LOADED
        budget = self.agent.budget
        if budget.max_tokens is not None and self.tokens > budget.max_tokens:
            return f"{self.tokens} tokens exceed the budget of {budget.max_tokens}"
        if budget.max_cost is not None and self.cost > Decimal(budget.max_cost):
            return f"cost {self.cost} exceeds the budget of {budget.max_cost}"
        return ""

    @staticmethod
    def attempt_cap_error(step: Step, tool: Tool) -> str:
        """Why an interrupted read-only step may not run again; empty if it may."""
        if tool.effect == Effect.READ_ONLY and step.attempt >= tool.max_attempts:
            return (f"read-only tool {tool.name} was interrupted {step.attempt} times "
                    f"(its cap is {tool.max_attempts})")
        return ""

    # -- steps --------------------------------------------------------------------------------

    def begin_step(self, plan: Plan, index: int) -> Step | None:
        """Add the start of step ``index`` (and its LLM request) to ``plan`` and commit it."""
        if self.should_stop():
            self.stop_here(plan)
            return None
        assert self.agent is not None, AGENT_LOADED
        budget = self.agent.budget
        if index > budget.max_steps:
            self.fail(plan, FailureCode.BUDGET_EXCEEDED,
                      f"step {index} would exceed the budget of {budget.max_steps} steps")
            self.commit(plan)
            return None
        ask_llm = not self.planned
        over = self.llm_budget_error() if ask_llm else ""
        if over:
            self.fail(plan, FailureCode.BUDGET_EXCEEDED, over)
            self.commit(plan)
            return None
        key = step_idempotency_key(self.run.pk, self.run.created_at, index)
        step = new_step(run_id=self.run.pk, index=index, status=StepStatus.DECIDING,
                        idempotency_key=key, started_at=plan.at)
        plan.event("step.started", {"idempotency_key": key}, index)
        plan.step_insert(step)
        if ask_llm:
            self.request_llm(plan, step)
        plan.crash_after(CrashPoint.AFTER_STEP_STARTED, index)
        self.commit(plan)
        self.steps.append(step)
        return step

    def request_llm(self, plan: Plan, step: Step) -> None:
        """Record the next LLM request (counted when committed; a retry is not a request)."""
        plan.event("llm.requested", {"request": self.llm_requests + 1}, step.index)
        plan.run["llm_requests"] = Add(1)
        self.llm_requests += 1

    def gate_and_start(self, plan: Plan, step: Step, tool: Tool,
                       approval: Approval | None = None) -> Step | None:
        """Evaluate policy, then start the tool, pause for approval, or fail the run."""
        assert self.agent is not None, AGENT_LOADED
        if approval is None and self.held_by_restore(step, tool):
            self.pause_restored(plan, step)
            return None
        # A decided step's arguments are the tool call's object (checked when decided).
        request = Request(tool.name, cast("dict[str, Any]", step.arguments), tool.effect,
                          step.index)
        try:
            verdict = self.agent.policy(request, self.run)
        except Exception as exc:
            message = f"policy raised {type(exc).__name__}: {exc}"
            if approval is not None:
                self.cancel_approval(plan, approval, message)
            plan.event("step.tool_failed", {"error": message, "started": False}, step.index)
            self.fail_step(plan, step, FailureCode.ERROR, message)
            return None
        if isinstance(verdict, Deny):
            plan.event("policy.denied", {"reason": verdict.reason, "tool": tool.name},
                       step.index)
            if approval is not None:
                self.cancel_approval(plan, approval, f"policy denied: {verdict.reason}")
            self.fail_step(plan, step, FailureCode.POLICY_DENIED, verdict.reason,
                           step_error=f"policy denied: {verdict.reason}")
            return None
        if isinstance(verdict, RequireApproval) and approval is None:
            standing = standing_authorization(self.run, plan.at)
            if standing is None:
                self.pause(plan, step, ApprovalKind.POLICY, verdict.title, verdict.detail,
                           StepStatus.WAITING, expires_in=expiry_seconds(verdict.expires_in))
                return None
            # Design §10: the person who authorized the schedule approved this ahead of time,
            # if the grant still stands when the start commits (checked inside its commit).
            mark = plan.mark()
            plan.event("side_effect.auto_confirmed", {
                "reason": "standing authorization", "title": verdict.title, "tool": tool.name,
                **standing}, step.index, actor=f"schedule:{standing['schedule']}")
            assert self.run.authorized_at is not None, "a standing authorization names it"
            plan.standing = StandingGuard(standing["schedule_id"], self.run.authorized_at)
            before = step.status, step.attempt, step.dispatches
            try:
                return self.start_tool(plan, step, tool, approval)
            except AuthorizationWithdrawn:  # nothing was written: ask a person after all,
                step.status, step.attempt, step.dispatches = before  # in the same commit as
                plan.rewind(mark)  # the step's decision, if this plan carries it
                self.pause(plan, step, ApprovalKind.POLICY, verdict.title,
                           verdict.detail, StepStatus.WAITING,
                           expires_in=expiry_seconds(verdict.expires_in))
                return None
        return self.start_tool(plan, step, tool, approval)

    def held_by_restore(self, step: Step, tool: Tool) -> bool:
        """Whether a person must decide before ``step``'s call: the database was restored from a
        backup taken while this run was unfinished (design §12b), so the run may have made this
        call, or later ones, after the backup's moment. Only reads on both counts go ahead."""
        return self.run.restored_at is not None and not (
            step.effect == Effect.READ_ONLY and tool.effect == Effect.READ_ONLY)

    def pause_restored(self, plan: Plan, step: Step) -> None:
        """Put the step's call before a person as a ``restored`` approval."""
        title, detail = restored_presentation(self.run, step)
        self.pause(plan, step, ApprovalKind.RESTORED, title, detail,
                   held_step_status(ApprovalKind.RESTORED, step.attempt))

    def start_tool(self, plan: Plan, step: Step, tool: Tool, approval: Approval | None = None,
                   **why: Any) -> Step:
        idx, attempt = step.index, step.attempt + 1
        if approval is not None:
            plan.event("approval.consumed", {"approval_id": approval.pk, "kind": approval.kind,
                                             "decided_by": approval.decided_by}, idx)
            plan.approval_move(approval.pk, ApprovalStatus.APPROVED,
                               status=ApprovalStatus.CONSUMED, consumed_at=plan.at)
        plan.event("step.tool_started", {"tool": tool.name, "effect": tool.effect,
                                         "attempt": attempt, "dispatches": tool.dispatches,
                                         **why}, idx)
        plan.step_update(step, status=StepStatus.EXECUTING, attempt=attempt,
                         dispatches=tool.dispatches)
        plan.crash_after(CrashPoint.AFTER_TOOL_STARTED, idx)
        self.commit(plan)
        return step

    def record_outcome(self, plan: Plan, step: Step, result: Any, error: str) -> dict[str, Any]:
        """Add the call's outcome to ``plan``; the payload of its event."""
        if error:
            payload = plan.event("step.tool_failed", {"error": error, "attempt": step.attempt,
                                                      "started": True}, step.index)
            plan.step_update(step, status=StepStatus.FAILED, error=error, finished_at=plan.at)
        else:
            payload = plan.event("step.tool_finished", {"result": result,
                                                        "attempt": step.attempt}, step.index)
            plan.step_update(step, status=StepStatus.SUCCEEDED, result=result,
                             finished_at=plan.at)
        plan.crash_after(CrashPoint.AFTER_TOOL_FINISHED, step.index)
        self.remember(step)
        return payload

    def record_dispatch(self, step: Step) -> None:
        """``ctx.dispatch()``: commit that the tool's outbound call may now go out."""
        plan = self.plan()
        plan.event("step.tool_dispatched", {"attempt": step.attempt}, step.index)
        plan.step_update(step, dispatched_attempt=step.attempt)
        plan.crash_after(CrashPoint.AFTER_TOOL_DISPATCHED, step.index)
        self.commit(plan)
        connection_release()  # the tool's outbound call comes next

    def remember(self, step: Step) -> None:
        """Show a finished step to the LLM from now on (once)."""
        if not self.transcript.entries or self.transcript.entries[-1].step_index != step.index:
            self.transcript.entries.append(entry(step))

    # -- endings and pauses -------------------------------------------------------------------

    def pause(self, plan: Plan, step: Step, kind: str, title: str, detail: str,
              step_status: str, expires_in: float | None = None) -> None:
        """Put the step's request before a person: an approval, the run waiting, no lease.
        With a deadline (the policy's, or the agent's default for other kinds) the approval
        expires if nobody decides in time."""
        if any(s is step for s in plan.step_inserts):  # the approval names the step's row:
            self.commit(plan)  # written first (a step started and decided in one plan)
            plan = self.plan()
        if expires_in is None and kind != ApprovalKind.POLICY:
            expires_in = default_expiry_seconds(self.run.agent)
        expires_at = None if expires_in is None else plan.at + timedelta(seconds=expires_in)
        digest = request_digest(step.tool, step.arguments, step.effect)
        payload = plan.event("approval.requested", {
            "kind": kind, "title": title, "tool": step.tool, "arguments": step.arguments,
            "effect": step.effect, "digest": digest, "attempt": step.attempt,
            "idempotency_key": step.idempotency_key}, step.index)
        if expires_at is not None:
            payload["expires_at"] = iso_time(expires_at)
        plan.approval_create = ApprovalDraft(dict(
            run_id=self.run.pk, step_id=step.pk, kind=kind, tool=step.tool,
            arguments=step.arguments, effect=step.effect, digest=digest, title=title[:300],
            detail=detail, created_at=plan.at, expires_at=expires_at), payload)
        plan.step_update(step, status=step_status)
        plan.event("run.paused", {"reason": kind}, step.index)
        self.release(plan, RunStatus.WAITING)
        plan.crash_after(CrashPoint.AFTER_PAUSE, step.index)
        self.commit(plan)

    def cancel_approval(self, plan: Plan, approval: Approval, reason: str) -> None:
        """An approved request that will not run after all: the approval is cancelled."""
        plan.event("approval.cancelled", {"approval_id": approval.pk, "reason": reason},
                   approval.step.index)
        plan.approval_move(approval.pk, ApprovalStatus.APPROVED, required=False,
                           status=ApprovalStatus.CANCELLED)

    def stop_here(self, plan: Plan) -> None:
        """This process is stopping: hand the run back to the queue, nothing in flight."""
        plan.event("run.released", {"reason": "worker stopping"})
        self.release(plan, RunStatus.QUEUED)
        self.commit(plan)

    def release(self, plan: Plan, status: str) -> None:
        plan.event("lease.released", {"owner": self.lease.owner, "epoch": self.lease.epoch})
        plan.run.update(status=status, lease_owner="", lease_expires_at=None)

    def finish(self, plan: Plan, output: Any) -> None:
        plan.event("run.succeeded", {"output": output})
        plan.run.update(output=output, planned=[])
        self.release(plan, RunStatus.SUCCEEDED)

    def fail_step(self, plan: Plan, step: Step, code: str, message: str, *,
                  step_error: str | None = None) -> None:
        """End ``step`` failed (its error ``step_error``, else ``message``) and the run with it,
        and commit."""
        plan.step_update(step, status=StepStatus.FAILED,
                         error=message if step_error is None else step_error,
                         finished_at=plan.at)
        self.fail(plan, code, message)
        self.commit(plan)

    def fail(self, plan: Plan, code: str, message: str) -> None:
        plan.event("run.failed", {"code": str(code), "message": message})
        plan.run.update(failure_code=code, failure_message=message, planned=[])
        self.release(plan, RunStatus.FAILED)
