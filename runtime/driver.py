"""The driver: executes a run step by step under a lease, following the design's loop (§5).

A steady-state step is two synced commits:
  1. ``llm.responded`` + ``step.decided`` + ``step.tool_started`` (before the tool runs),
  2. ``step.tool_finished`` + the next ``step.started`` + ``llm.requested`` (before the LLM call).
Whatever must be durable before an outside call is committed before it, never folded past it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import F

from . import crashpoints
from .agents import Agent, get_agent
from .audit import EventSpec
from .canonical import check_payload, request_digest
from .clock import SYSTEM_CLOCK, Clock
from .crashpoints import CrashPoint
from .errors import (
    InvalidArguments,
    InvalidPayload,
    LeaseLost,
    ToolNotRegistered,
    UnknownAgent,
)
from .lease import LeaseKeeper, make_owner
from .llm import Decision, FinalAnswer, Transcript, TranscriptEntry
from .models import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    FailureCode,
    Run,
    RunStatus,
    Step,
    StepStatus,
)
from .policy import Deny, Request, RequireApproval
from .store import Acquired, Lease, lease_commit, run_acquire, step_insert, step_write
from .tools import Tool, ToolContext

# Events that start something outside (an LLM request, a tool call, a dispatch) need the lease
# unexpired by the wall clock, not only held.
_GATED = frozenset({"llm.requested", "step.tool_started", "step.tool_dispatched"})



@dataclass
class Tx:
    """One commit being assembled: its events, run-row changes, row writes and crash points."""

    now: datetime
    specs: list[EventSpec] = field(default_factory=list)
    run_fields: dict[str, Any] = field(default_factory=dict)
    # Row writes: each a callable that prepares its statement (before the transaction) and
    # returns what runs it (inside); ``late_payloads`` when one puts an id into a payload.
    writes: list[Callable[[], Callable[[], Any]]] = field(default_factory=list)
    after: list[tuple[CrashPoint, int | None]] = field(default_factory=list)
    gated: bool = False
    late_payloads: bool = False
    orm_writes: bool = False
    step_fields: dict[int, dict[str, Any]] = field(default_factory=dict)

    def event(self, kind: str, payload: dict[str, Any], step: int | None = None) -> dict:
        self.specs.append(EventSpec(kind, payload, step))
        self.gated = self.gated or kind in _GATED
        return payload

    def step_update(self, step: Step, **fields: Any) -> None:
        """Change ``step`` now and write it in the commit: one UPDATE per step per commit
        (later changes to the same step join the first one's write)."""
        for k, v in fields.items():
            setattr(step, k, v)
        pending = self.step_fields.get(id(step))
        if pending is not None:
            pending.update(fields)
            return
        self.step_fields[id(step)] = pending = dict(fields)
        self.prepare(lambda: step_write(step, pending))

    def crash_after(self, point: CrashPoint, step: int | None) -> None:
        self.after.append((point, step))

    def prepare(self, preparer: Callable[[], Callable[[], Any]]) -> None:
        """A row write whose statement ``preparer`` builds before the transaction begins."""
        self.writes.append(preparer)

    def write(self, write: Callable[[], Any], *, puts_ids_in_payloads: bool = False) -> None:
        """A row write run as it is inside the transaction (through the ORM)."""
        self.writes.append(lambda: write)
        self.orm_writes = True
        self.late_payloads = self.late_payloads or puts_ids_in_payloads

    def prepared_writes(self) -> Callable[[], None] | None:
        """The row writes with their statements built, to run inside the transaction."""
        if not self.writes:
            return None
        ready = [prepare() for prepare in self.writes]

        def run() -> None:
            for write in ready:
                write()

        return run


class Driver:
    """Acquires runs and executes them until they pause, end, or the lease is lost."""

    def __init__(
        self,
        owner: str | None = None,
        *,
        name: str = "runtime",
        lease_seconds: float | None = None,
        clock: Clock | None = None,
        keeper: LeaseKeeper | None = None,
        owner_is_dead: Any = None,
        sleep: Callable[[float], Any] | None = None,
    ) -> None:
        self.owner = owner or make_owner(name)
        self.lease_seconds = float(lease_seconds or settings.RUNTIME.get("LEASE_SECONDS", 30))
        self.clock = clock or SYSTEM_CLOCK
        self.keeper = keeper
        self.owner_is_dead = owner_is_dead
        # How a wait before an LLM retry passes time, in short slices (tests pass a fast one).
        self.sleep = sleep or time.sleep

    def drive(self, run_id: int) -> Run:
        """Take the run's lease (claim, or take over an expired one) and execute it.

        Returns the run once it is paused, finished or failed. Raises ``RunLeased`` if someone
        else holds a live lease, ``LeaseLost`` if this process lost it while executing.
        """
        return self.execute(self.acquire(run_id))

    def acquire(self, run_id: int) -> Acquired:
        """Take the run's lease in one transaction; nothing else is done yet."""
        acquired = run_acquire(run_id, self.owner, lease_seconds=self.lease_seconds,
                               now=self.clock.now(), owner_is_dead=self.owner_is_dead)
        if acquired.resumed:
            crashpoints.reached(CrashPoint.AFTER_RUN_RESUMED, run_id=run_id,
                                step_index=acquired.interrupted_step)
        if acquired.interrupted_step is not None:
            crashpoints.reached(CrashPoint.AFTER_STEP_INTERRUPTED, run_id=run_id,
                                step_index=acquired.interrupted_step)
        return acquired

    def execute(self, acquired: Acquired, should_stop: Callable[[], bool] | None = None,
                *, reload: bool = True) -> Run:
        """Execute an acquired run, heartbeating its lease, until it pauses or ends.

        ``should_stop`` is polled between steps; when it turns true the run is released
        (``run.released``, queued again) at the next point where nothing is in flight.
        Returns the run read back from the database, or with ``reload=False`` the claimed
        run object with only its status brought up to date (a worker needs no more).
        """
        keeper = self.keeper
        own_keeper = keeper is None
        if keeper is None:
            keeper = LeaseKeeper(self.lease_seconds, clock=self.clock).start()
        keeper.add(acquired.lease)
        try:
            execution = Execution(self, acquired.lease, acquired.run, should_stop,
                                  first_claim=not (acquired.resumed or acquired.taken_over))
            execution.execute()
        finally:
            keeper.discard(acquired.lease)
            if own_keeper:
                keeper.stop()
        if not reload:
            acquired.run.status = execution.status
            return acquired.run
        return Run.objects.get(pk=acquired.run.pk)


class Execution:
    """The state of one run while this process holds its lease."""

    def __init__(self, driver: Driver, lease: Lease, run: Run,
                 should_stop: Callable[[], bool] | None = None, first_claim: bool = False) -> None:
        self.driver, self.lease, self.run = driver, lease, run
        self.should_stop = should_stop or (lambda: False)
        self.clock = driver.clock
        # A run claimed for the first time has no steps yet: nothing to read.
        self.steps: list[Step] = [] if first_claim else list(
            Step.objects.filter(run_id=run.pk).order_by("index"))
        self.transcript = Transcript(run.pk, run.agent, run.input, [
            _entry(s) for s in self.steps
            if s.tool and s.status in (StepStatus.SUCCEEDED, StepStatus.FAILED)
        ])
        self.planned: list[dict[str, Any]] = list(run.planned or [])
        self.llm_requests = run.llm_requests
        self.tokens = run.tokens_in + run.tokens_out
        self.cost = Decimal(run.cost)
        self.agent: Agent | None = None
        self.status: str = run.status  # as last committed by this execution

    # -- the loop ---------------------------------------------------------------------------

    def execute(self) -> None:
        try:
            self.agent = get_agent(self.run.agent)
        except UnknownAgent as exc:
            tx = self.tx()
            self.fail(tx, FailureCode.ERROR, str(exc))
            self.commit(tx)
            return
        from .recovery import recover  # the interruption contract lives in its own module

        step = recover(self)
        while step is not None:
            if step.status == StepStatus.DECIDING:
                step = self.decide(step)
            elif step.status == StepStatus.EXECUTING:
                step = self.run_tool(step)
            else:  # pragma: no cover - a bug, not a state the loop can reach
                raise AssertionError(f"run {self.run.pk} step {step.index} is {step.status}")

    def tx(self) -> Tx:
        return Tx(now=self.clock.now())

    def commit(self, tx: Tx) -> None:
        if tx.gated and self.lease.lost:
            raise LeaseLost(self.lease.run_id, self.lease.owner, "lease lost (heartbeat)")
        lease_commit(self.lease, tx.specs, now=tx.now, run_fields=tx.run_fields,
                     writes=tx.prepared_writes(), require_unexpired=tx.gated,
                     late_payloads=tx.late_payloads, plain_sql=not tx.orm_writes)
        self.status = tx.run_fields.get("status", self.status)
        for point, step in tx.after:
            crashpoints.reached(point, run_id=self.run.pk, step_index=step)

    def begin_step(self, tx: Tx, index: int) -> Step | None:
        """Add the start of step ``index`` (and its LLM request) to ``tx`` and commit it."""
        if self.should_stop():
            self.stop_here(tx)
            return None
        budget = self.agent.budget
        if index > budget.max_steps:
            self.fail(tx, FailureCode.BUDGET_EXCEEDED,
                      f"step {index} would exceed the budget of {budget.max_steps} steps")
            self.commit(tx)
            return None
        ask_llm = not self.planned
        if ask_llm and self.llm_requests + 1 > budget.max_llm_requests:
            self.fail(tx, FailureCode.BUDGET_EXCEEDED, f"LLM request {self.llm_requests + 1} "
                      f"would exceed the budget of {budget.max_llm_requests}")
            self.commit(tx)
            return None
        key = f"run{self.run.pk}-step{index}-{secrets.token_hex(6)}"
        step = Step(run_id=self.run.pk, index=index, status=StepStatus.DECIDING,
                    idempotency_key=key, started_at=tx.now)
        tx.event("step.started", {"idempotency_key": key}, index)
        tx.prepare(lambda: step_insert(step))
        if ask_llm:
            self.request_llm(tx, step)
        tx.crash_after(CrashPoint.AFTER_STEP_STARTED, index)
        self.commit(tx)
        self.steps.append(step)
        if ask_llm:
            self.llm_requests += 1
        return step

    def request_llm(self, tx: Tx, step: Step) -> None:
        tx.event("llm.requested", {"request": self.llm_requests + 1}, step.index)
        tx.run_fields["llm_requests"] = F("llm_requests") + 1

    def decide(self, step: Step) -> Step | None:
        from .deciding import decide  # asking the LLM, with retries, lives in its own module

        return decide(self, step)

    def apply_decision(self, tx: Tx, step: Step, decision: Decision) -> Step | None:
        idx = step.index
        if isinstance(decision, FinalAnswer):
            try:
                output = check_payload("final answer", decision.output)
            except InvalidPayload as exc:
                tx.step_update(step, status=StepStatus.FAILED, error=str(exc), finished_at=tx.now)
                self.fail(tx, FailureCode.ERROR, str(exc))
                self.commit(tx)
                return None
            tx.event("step.decided", {"final": True, "output": output}, idx)
            tx.step_update(step, status=StepStatus.SUCCEEDED, result=output, finished_at=tx.now)
            self.finish(tx, output)
            tx.crash_after(CrashPoint.AFTER_STEP_DECIDED, idx)
            self.commit(tx)
            return None
        tool = self.agent.tools.get(decision.tool)
        error = ""
        try:
            arguments = check_payload("tool arguments", decision.arguments)
        except InvalidPayload as exc:
            arguments, error = None, str(exc)
        effect = tool.effect if tool is not None else ""
        tx.event("step.decided", {"tool": decision.tool, "arguments": arguments, "effect": effect,
                                  "idempotency_key": step.idempotency_key}, idx)
        tx.step_update(step, tool=decision.tool, arguments=arguments, effect=effect)
        tx.crash_after(CrashPoint.AFTER_STEP_DECIDED, idx)
        if not error:
            try:
                if tool is None:
                    raise ToolNotRegistered(self.agent.name, decision.tool)
                tool.validate(arguments)
            except (ToolNotRegistered, InvalidArguments) as exc:
                error = str(exc)
        if error:
            tx.event("step.tool_failed", {"error": error, "started": False}, idx)
            tx.step_update(step, status=StepStatus.FAILED, error=error, finished_at=tx.now)
            self.transcript.entries.append(_entry(step))
            return self.begin_step(tx, idx + 1)
        return self.gate_and_start(tx, step, tool)

    def gate_and_start(self, tx: Tx, step: Step, tool: Tool,
                       approval: Approval | None = None) -> Step | None:
        """Evaluate policy, then start the tool, pause for approval, or fail the run."""
        request = Request(tool.name, step.arguments, tool.effect, step.index)
        try:
            verdict = self.agent.policy(request, self.run)
        except Exception as exc:
            message = f"policy raised {type(exc).__name__}: {exc}"
            if approval is not None:
                self.cancel_approval(tx, approval, message)
            tx.event("step.tool_failed", {"error": message, "started": False}, step.index)
            tx.step_update(step, status=StepStatus.FAILED, error=message, finished_at=tx.now)
            self.fail(tx, FailureCode.ERROR, message)
            self.commit(tx)
            return None
        if isinstance(verdict, Deny):
            tx.event("policy.denied", {"reason": verdict.reason, "tool": tool.name}, step.index)
            if approval is not None:
                self.cancel_approval(tx, approval, f"policy denied: {verdict.reason}")
            tx.step_update(step, status=StepStatus.FAILED, error=f"policy denied: {verdict.reason}",
                           finished_at=tx.now)
            self.fail(tx, FailureCode.POLICY_DENIED, verdict.reason)
            self.commit(tx)
            return None
        if isinstance(verdict, RequireApproval) and approval is None:
            self.pause(tx, step, ApprovalKind.POLICY, verdict.title, verdict.detail,
                       StepStatus.WAITING)
            return None
        return self.start_tool(tx, step, tool, approval)

    def start_tool(self, tx: Tx, step: Step, tool: Tool, approval: Approval | None = None,
                   **why: Any) -> Step:
        idx, attempt = step.index, step.attempt + 1
        if approval is not None:
            tx.event("approval.consumed", {"approval_id": approval.pk, "kind": approval.kind,
                                           "decided_by": approval.decided_by}, idx)
            tx.write(lambda: _consume(approval, tx.now))
        tx.event("step.tool_started", {"tool": tool.name, "effect": tool.effect,
                                       "attempt": attempt, "dispatches": tool.dispatches,
                                       **why}, idx)
        tx.step_update(step, status=StepStatus.EXECUTING, attempt=attempt,
                       dispatches=tool.dispatches)
        tx.crash_after(CrashPoint.AFTER_TOOL_STARTED, idx)
        self.commit(tx)
        return step

    def run_tool(self, step: Step) -> Step | None:
        tool = self.agent.tools[step.tool]
        kwargs = tool.validate(step.arguments)
        ctx = ToolContext(self.run.pk, step.index, step.attempt, step.idempotency_key,
                          self.agent.name, _on_dispatch=lambda: self.dispatch(step))
        if self.lease.lost:
            raise LeaseLost(self.lease.run_id, self.lease.owner, "lease lost (heartbeat)")
        result, error = None, ""
        try:
            result = tool.invoke(ctx, kwargs)
        except LeaseLost:
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        crashpoints.reached(CrashPoint.AFTER_TOOL_EFFECT, run_id=self.run.pk,
                            step_index=step.index)
        if not error:
            try:
                result = check_payload(f"result of {tool.name}", result)
            except InvalidPayload as exc:
                result, error = None, str(exc)
        tx = self.tx()
        self.record_outcome(tx, step, result, error)
        try:
            return self.begin_step(tx, step.index + 1)
        except LeaseLost as exc:
            if not exc.expired_but_held:
                raise
            # Expired but nobody took it: the result is still ours to record; start nothing.
            tx = self.tx()
            self.record_outcome(tx, step, result, error)
            self.commit(tx)
            raise

    def record_outcome(self, tx: Tx, step: Step, result: Any, error: str) -> None:
        if error:
            tx.event("step.tool_failed", {"error": error, "attempt": step.attempt,
                                          "started": True}, step.index)
            tx.step_update(step, status=StepStatus.FAILED, error=error, finished_at=tx.now)
        else:
            tx.event("step.tool_finished", {"result": result, "attempt": step.attempt},
                     step.index)
            tx.step_update(step, status=StepStatus.SUCCEEDED, result=result, finished_at=tx.now)
        tx.crash_after(CrashPoint.AFTER_TOOL_FINISHED, step.index)
        if not self.transcript.entries or self.transcript.entries[-1].step_index != step.index:
            self.transcript.entries.append(_entry(step))

    def dispatch(self, step: Step) -> None:
        tx = self.tx()
        tx.event("step.tool_dispatched", {"attempt": step.attempt}, step.index)
        tx.step_update(step, dispatched_attempt=step.attempt)
        tx.crash_after(CrashPoint.AFTER_TOOL_DISPATCHED, step.index)
        self.commit(tx)

    # -- endings and pauses -----------------------------------------------------------------

    def pause(self, tx: Tx, step: Step, kind: str, title: str, detail: str,
              step_status: str) -> None:
        """Put the step's request before a person: an approval, the run waiting, no lease."""
        digest = request_digest(step.tool, step.arguments, step.effect)
        payload = tx.event("approval.requested", {
            "kind": kind, "title": title, "tool": step.tool, "arguments": step.arguments,
            "effect": step.effect, "digest": digest, "attempt": step.attempt,
            "idempotency_key": step.idempotency_key}, step.index)

        def create() -> None:
            approval = Approval.objects.create(
                run_id=self.run.pk, step=step, kind=kind, tool=step.tool,
                arguments=step.arguments, effect=step.effect, digest=digest, title=title[:300],
                detail=detail, created_at=tx.now)
            payload["approval_id"] = approval.pk

        tx.write(create, puts_ids_in_payloads=True)
        tx.step_update(step, status=step_status)
        tx.event("run.paused", {"reason": kind}, step.index)
        self.release(tx, RunStatus.WAITING)
        tx.crash_after(CrashPoint.AFTER_PAUSE, step.index)
        self.commit(tx)

    def cancel_approval(self, tx: Tx, approval: Approval, reason: str) -> None:
        """An approved request that will not run after all: the approval is cancelled."""
        tx.event("approval.cancelled", {"approval_id": approval.pk, "reason": reason},
                 approval.step.index)
        tx.write(lambda: Approval.objects.filter(
            pk=approval.pk, status=ApprovalStatus.APPROVED).update(
            status=ApprovalStatus.CANCELLED))

    def stop_here(self, tx: Tx) -> None:
        """This process is stopping: hand the run back to the queue, nothing in flight."""
        tx.event("run.released", {"reason": "worker stopping"})
        self.release(tx, RunStatus.QUEUED)
        self.commit(tx)

    def release(self, tx: Tx, status: str) -> None:
        tx.event("lease.released", {"owner": self.lease.owner, "epoch": self.lease.epoch})
        tx.run_fields.update(status=status, lease_owner="", lease_expires_at=None)

    def finish(self, tx: Tx, output: Any) -> None:
        tx.event("run.succeeded", {"output": output})
        tx.run_fields.update(output=output, planned=[])
        self.release(tx, RunStatus.SUCCEEDED)

    def fail(self, tx: Tx, code: str, message: str) -> None:
        tx.event("run.failed", {"code": str(code), "message": message})
        tx.run_fields.update(failure_code=code, failure_message=message, planned=[])
        self.release(tx, RunStatus.FAILED)


def _consume(approval: Approval, now: datetime) -> None:
    """Mark an approval consumed; it authorizes exactly one start (compare-and-set)."""
    updated = Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.APPROVED).update(
        status=ApprovalStatus.CONSUMED, consumed_at=now)
    if updated != 1:
        raise AssertionError(f"approval {approval.pk} was not approved when consumed")


def _entry(step: Step) -> TranscriptEntry:
    return TranscriptEntry(step.index, step.tool, step.arguments or {}, step.result, step.error)
