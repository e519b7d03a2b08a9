"""Replay: rebuild a run's state from its audit events alone (``replay_events``), one handler
per kind of event. ``runtime.audit.compare`` holds the result against the rows and says where
they differ; its docstring lists what is covered."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from runtime.canonical import parse_time
from runtime.models import (
    ApprovalStatus,
    FailureCode,
    RunStatus,
    StepStatus,
    held_step_status,
)
from runtime.storage.events import EventKind


@dataclass
class RunState:
    """The run row as its events describe it."""

    created: bool = False
    agent: str = ""
    input: Any = None
    created_by: str = ""
    created_at: datetime | None = None
    status: str = ""
    failure_code: str = ""
    failure_message: str = ""
    output: Any = None
    lease_owner: str = ""
    lease_epoch: int | None = 0  # None: a lease.taken event that gave no epoch
    leased: bool = False  # whether lease_expires_at is set
    llm_requests: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = Decimal(0)
    responses: int = 0
    planned: int = 0
    schedule_id: int | None = None
    occurrence_at: datetime | None = None
    authorized_at: datetime | None = None
    restored_at: datetime | None = None


@dataclass
class StepState:
    """A step row as its events describe it."""

    index: int
    status: str = StepStatus.DECIDING
    tool: str = ""
    arguments: Any = None
    effect: str = ""
    idempotency_key: str = ""
    result: Any = None
    error: str = ""
    attempt: int | None = 0  # None: a step.tool_started event that gave no attempt
    dispatches: bool = False
    dispatched_attempt: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    def end(self, status: str, at: datetime, **fields: Any) -> None:
        self.status, self.finished_at = status, at
        for name, value in fields.items():
            setattr(self, name, value)


@dataclass
class ApprovalState:
    """An approval row as its events describe it."""

    pk: int
    step_index: int | None
    kind: str
    tool: str
    arguments: Any
    effect: str
    digest: str
    title: str
    created_at: datetime
    status: str = ApprovalStatus.PENDING
    decided_by: str = ""
    decided_at: datetime | None = None
    note: str = ""
    result: Any = None
    consumed_at: datetime | None = None
    expires_at: datetime | None = None
    effective_arguments: Any = None
    effective_digest: str = ""
    edited_by: str = ""


@dataclass
class Replayed:
    """Everything a run's events say its rows hold."""

    run: RunState = field(default_factory=RunState)
    steps: dict[int, StepState] = field(default_factory=dict)
    approvals: dict[int, ApprovalState] = field(default_factory=dict)
    events: int = 0
    unreadable: list[str] = field(default_factory=list)  # events replay could not apply


def replay_events(events: Iterable[tuple[str, int | None, Any, datetime]]) -> Replayed:
    """Fold (kind, step_index, payload, at) tuples, in sequence order, into the state they
    describe: the same transitions the loop, the claims and the operators' decisions make,
    one handler per event kind (``HANDLERS``)."""
    folding = _Folding(Replayed())
    out = folding.out
    for kind, idx, p, at in events:
        out.events += 1
        handle = HANDLERS.get(kind)
        if handle is None:
            out.unreadable.append(f"event #{out.events} is of kind {kind!r}, which replay "
                                  "does not know: the rows cannot be vouched for")
            continue
        if kind not in _KEEP_CANCELLED:
            folding.cancelled = []
        step = None if idx is None else (out.steps.get(idx)
                                         or out.steps.setdefault(idx, StepState(idx)))
        handle(folding, step, p if isinstance(p, dict) else {}, at)
    return out


@dataclass
class _Folding:
    """Replay in progress: the state so far, and the approvals ``api.cancel`` cancelled in
    the run's own commit (its ``run.cancelled`` writes the canceller over their decider)."""

    out: Replayed
    cancelled: list[ApprovalState] = field(default_factory=list)


Handler = Callable[[_Folding, "StepState | None", dict[str, Any], datetime], None]

# The events of one cancel commit: the list of approvals it cancelled survives them.
_KEEP_CANCELLED = frozenset({EventKind.APPROVAL_CANCELLED, EventKind.STEP_INTERRUPTED,
                             EventKind.RUN_CANCELLED})


# -- the run ----------------------------------------------------------------------------------

def _run_created(f: _Folding, step: StepState | None, p: dict[str, Any], at: datetime) -> None:
    run = f.out.run
    run.created, run.status, run.created_at = True, RunStatus.QUEUED, at
    run.agent, run.input = p.get("agent", ""), p.get("input")
    run.created_by = p.get("created_by", "")
    origin = p.get("schedule") or {}
    run.schedule_id = origin.get("id")
    run.occurrence_at = parse_time(origin.get("occurrence"))
    run.authorized_at = parse_time(origin.get("authorized_at"))
    run.restored_at = parse_time(p.get("restored_at"))


def _run_running(f: _Folding, step: StepState | None, p: dict[str, Any], at: datetime) -> None:
    f.out.run.status = RunStatus.RUNNING


def _run_queued(f: _Folding, step: StepState | None, p: dict[str, Any], at: datetime) -> None:
    f.out.run.status = RunStatus.QUEUED


def _run_paused(f: _Folding, step: StepState | None, p: dict[str, Any], at: datetime) -> None:
    f.out.run.status = RunStatus.WAITING


def _lease_taken(f: _Folding, step: StepState | None, p: dict[str, Any], at: datetime) -> None:
    run = f.out.run
    run.lease_owner, run.lease_epoch, run.leased = p.get("owner", ""), p.get("epoch"), True


def _lease_released(f: _Folding, step: StepState | None, p: dict[str, Any],
                    at: datetime) -> None:
    f.out.run.lease_owner, f.out.run.leased = "", False


def _run_succeeded(f: _Folding, step: StepState | None, p: dict[str, Any],
                   at: datetime) -> None:
    run = f.out.run
    run.status, run.output, run.planned = RunStatus.SUCCEEDED, p.get("output"), 0


def _run_failed(f: _Folding, step: StepState | None, p: dict[str, Any], at: datetime) -> None:
    run = f.out.run
    run.status, run.planned = RunStatus.FAILED, 0
    run.failure_code, run.failure_message = p.get("code", ""), p.get("message", "")
    _fail_deciding_step(f.out.steps, run, at)


def _run_cancelled(f: _Folding, step: StepState | None, p: dict[str, Any],
                   at: datetime) -> None:
    f.out.run.status, f.out.run.planned = RunStatus.CANCELLED, 0
    for a in f.cancelled:  # api.cancel writes the canceller over the approval's decider
        a.decided_by, a.note, a.decided_at = p.get("by", ""), p.get("reason", ""), at


def _run_restored(f: _Folding, step: StepState | None, p: dict[str, Any],
                  at: datetime) -> None:
    """The restore fence: the run is queued, unleased, and held from its backup's moment."""
    run = f.out.run
    run.status, run.lease_owner, run.leased = RunStatus.QUEUED, "", False
    run.restored_at = parse_time(p.get("backup_taken_at"))


def _llm_requested(f: _Folding, step: StepState | None, p: dict[str, Any],
                   at: datetime) -> None:
    if p.get("attempt", 1) == 1:  # a retry is the same request
        f.out.run.llm_requests += 1


def _llm_responded(f: _Folding, step: StepState | None, p: dict[str, Any],
                   at: datetime) -> None:
    run = f.out.run
    run.tokens_in += int(p.get("tokens_in", 0))
    run.tokens_out += int(p.get("tokens_out", 0))
    run.cost += Decimal(str(p.get("cost", "0")))  # written as str(Decimal)
    run.responses += 1
    run.planned = int(p.get("decisions", 1))


def _fail_deciding_step(steps: dict[int, StepState], run: RunState, at: datetime) -> None:
    """A budget refusal, or a final answer that cannot be stored, fails the step being decided
    in the run's own ``run.failed`` (no step event says so). An unknown agent fails the run
    and leaves a step deciding as it was."""
    fails_step = (run.failure_code == FailureCode.BUDGET_EXCEEDED
                  or (run.failure_code == FailureCode.ERROR
                      and run.failure_message.startswith("final answer: ")))
    if not fails_step:
        return
    for s in steps.values():
        if s.status == StepStatus.DECIDING:
            s.end(StepStatus.FAILED, at, error=run.failure_message)


# -- a step -----------------------------------------------------------------------------------

def _step_started(f: _Folding, step: StepState | None, p: dict[str, Any],
                  at: datetime) -> None:
    if step is None:
        return
    step.status = StepStatus.DECIDING
    step.idempotency_key = p.get("idempotency_key", step.idempotency_key)
    if step.started_at is None:
        step.started_at = at


def _step_decided(f: _Folding, step: StepState | None, p: dict[str, Any],
                  at: datetime) -> None:
    if step is None:
        return
    f.out.run.planned = max(f.out.run.planned - 1, 0)
    if p.get("final"):
        step.end(StepStatus.SUCCEEDED, at, result=p.get("output"))
    else:
        step.tool, step.arguments = p.get("tool", ""), p.get("arguments")
        step.effect = p.get("effect", "")


def _step_failed(f: _Folding, step: StepState | None, p: dict[str, Any], at: datetime) -> None:
    if step is not None:  # (a Pydantic AI tool's retry keeps what the model was told)
        step.end(StepStatus.FAILED, at, error=p.get("error", ""),
                 **({"result": p["retry"]} if "retry" in p else {}))


def _policy_denied(f: _Folding, step: StepState | None, p: dict[str, Any],
                   at: datetime) -> None:
    if step is not None:
        step.end(StepStatus.FAILED, at, error=f"policy denied: {p.get('reason', '')}")


def _llm_failed(f: _Folding, step: StepState | None, p: dict[str, Any], at: datetime) -> None:
    if step is not None and "retry_in" not in p:  # the last attempt fails the step
        step.end(StepStatus.FAILED, at, error=p.get("error", ""))


def _tool_started(f: _Folding, step: StepState | None, p: dict[str, Any],
                  at: datetime) -> None:
    if step is not None:
        step.status, step.attempt = StepStatus.EXECUTING, p.get("attempt")
        step.dispatches = bool(p.get("dispatches", False))


def _tool_dispatched(f: _Folding, step: StepState | None, p: dict[str, Any],
                     at: datetime) -> None:
    if step is not None:
        step.dispatched_attempt = p.get("attempt")


def _tool_finished(f: _Folding, step: StepState | None, p: dict[str, Any],
                   at: datetime) -> None:
    if step is not None:
        step.end(StepStatus.SUCCEEDED, at, result=p.get("result"))


def _step_interrupted(f: _Folding, step: StepState | None, p: dict[str, Any],
                      at: datetime) -> None:
    if step is not None:
        step.status = StepStatus.INTERRUPTED


def _recorded(f: _Folding, step: StepState | None, p: dict[str, Any], at: datetime) -> None:
    """Events that change no row: what was decided is on the record, not in a column."""


# -- approvals --------------------------------------------------------------------------------

def _approval_requested(f: _Folding, step: StepState | None, p: dict[str, Any],
                        at: datetime) -> None:
    if step is None:
        return
    kind = p.get("kind", "")
    step.status = held_step_status(kind, step.attempt or 0)
    pk = p.get("approval_id")
    if not isinstance(pk, int):
        f.out.unreadable.append(f"approval.requested on step {step.index} carries no approval "
                                "id")
        return
    f.out.approvals[pk] = ApprovalState(
        pk, step.index, kind, p.get("tool", ""), p.get("arguments"), p.get("effect", ""),
        p.get("digest", ""), str(p.get("title", ""))[:300], at,
        expires_at=parse_time(p.get("expires_at")))


def _approval(f: _Folding, step: StepState | None, kind: str,
              p: dict[str, Any]) -> ApprovalState | None:
    """The approval an event names, or None (reported) when no request created it."""
    found = f.out.approvals.get(p.get("approval_id"))  # type: ignore[arg-type]
    if found is None:
        f.out.unreadable.append(f"{kind} names approval {p.get('approval_id')!r}, which no "
                                "approval.requested created")
    return found


def _approval_edited(f: _Folding, step: StepState | None, p: dict[str, Any],
                     at: datetime) -> None:
    """A person edited a policy call before allowing it: the step's request is the edit."""
    a = None if step is None else _approval(f, step, EventKind.APPROVAL_EDITED, p)
    if a is None or step is None:
        return
    step.arguments = a.effective_arguments = p.get("arguments")
    a.effective_digest, a.edited_by = p.get("effective_digest", ""), p.get("edited_by", "")


def _decided(status: ApprovalStatus, kind: EventKind, *, queues: bool) -> Handler:
    """A person's decision: the approval ``status`` by its decider; ``queues`` the run."""
    def handle(f: _Folding, step: StepState | None, p: dict[str, Any], at: datetime) -> None:
        if queues:
            f.out.run.status = RunStatus.QUEUED
        if step is None:
            return
        a = _approval(f, step, kind, p)
        if a is None:
            return
        a.status = status
        a.decided_by, a.note, a.decided_at = p.get("decided_by", ""), p.get("note", ""), at
        if status == ApprovalStatus.RESOLVED:
            a.result = p.get("result")
        if status == ApprovalStatus.REJECTED:
            step.end(StepStatus.REJECTED, at)
    return handle


def _approval_consumed(f: _Folding, step: StepState | None, p: dict[str, Any],
                       at: datetime) -> None:
    a = None if step is None else _approval(f, step, EventKind.APPROVAL_CONSUMED, p)
    if a is not None:
        a.status, a.consumed_at = ApprovalStatus.CONSUMED, at


def _approval_cancelled(f: _Folding, step: StepState | None, p: dict[str, Any],
                        at: datetime) -> None:
    a = None if step is None else _approval(f, step, EventKind.APPROVAL_CANCELLED, p)
    if a is not None:
        a.status = ApprovalStatus.CANCELLED
        f.cancelled.append(a)


def _approval_expired(f: _Folding, step: StepState | None, p: dict[str, Any],
                      at: datetime) -> None:
    a = None if step is None else _approval(f, step, EventKind.APPROVAL_EXPIRED, p)
    if a is None or step is None:
        return
    a.status, a.decided_at = ApprovalStatus.EXPIRED, at
    if step.status == StepStatus.WAITING:  # a policy question: the call never started
        step.end(StepStatus.FAILED, at, error=p.get("message", ""))


# What each kind of event means for the rows: one handler per kind of the catalogue
# (``EventKind``; a test keeps the two equal).
HANDLERS: dict[str, Handler] = {
    EventKind.RUN_CREATED: _run_created,
    EventKind.RUN_STARTED: _run_running,
    EventKind.RUN_RESUMED: _run_running,
    EventKind.RUN_PAUSED: _run_paused,
    EventKind.RUN_RELEASED: _run_queued,
    EventKind.RUN_SUCCEEDED: _run_succeeded,
    EventKind.RUN_FAILED: _run_failed,
    EventKind.RUN_CANCELLED: _run_cancelled,
    EventKind.RUN_RESTORED: _run_restored,
    EventKind.LEASE_TAKEN: _lease_taken,
    EventKind.LEASE_TAKEN_OVER: _lease_taken,
    EventKind.LEASE_RELEASED: _lease_released,
    EventKind.STEP_STARTED: _step_started,
    EventKind.STEP_DECIDED: _step_decided,
    EventKind.STEP_TOOL_STARTED: _tool_started,
    EventKind.STEP_TOOL_DISPATCHED: _tool_dispatched,
    EventKind.STEP_TOOL_FINISHED: _tool_finished,
    EventKind.STEP_TOOL_FAILED: _step_failed,
    EventKind.STEP_INTERRUPTED: _step_interrupted,
    EventKind.STEP_OUTCOME_UNKNOWN: _recorded,
    EventKind.LLM_REQUESTED: _llm_requested,
    EventKind.LLM_RESPONDED: _llm_responded,
    EventKind.LLM_FAILED: _llm_failed,
    EventKind.APPROVAL_REQUESTED: _approval_requested,
    EventKind.APPROVAL_EDITED: _approval_edited,
    EventKind.APPROVAL_GRANTED: _decided(ApprovalStatus.APPROVED, EventKind.APPROVAL_GRANTED,
                                         queues=True),
    EventKind.APPROVAL_REJECTED: _decided(ApprovalStatus.REJECTED, EventKind.APPROVAL_REJECTED,
                                          queues=False),
    EventKind.APPROVAL_RESOLVED: _decided(ApprovalStatus.RESOLVED, EventKind.APPROVAL_RESOLVED,
                                          queues=True),
    EventKind.APPROVAL_CONSUMED: _approval_consumed,
    EventKind.APPROVAL_CANCELLED: _approval_cancelled,
    EventKind.APPROVAL_EXPIRED: _approval_expired,
    EventKind.APPROVAL_WARNED: _recorded,
    EventKind.APPROVAL_ESCALATED: _recorded,
    EventKind.RECONCILE_DECIDED: _recorded,
    EventKind.POLICY_DENIED: _policy_denied,
    EventKind.SIDE_EFFECT_AUTO_CONFIRMED: _recorded,
}
REPLAYED_KINDS = frozenset(HANDLERS)
