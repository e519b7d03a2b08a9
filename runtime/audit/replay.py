"""Replay: rebuild a run's state from its audit events alone and compare it with the rows.

The event chain is what an auditor trusts (``audit.verify`` proves it is intact); the run, step
and approval rows are what the console shows and the loop acts on. Someone able to write the
database could edit a row without writing an event (who approved, what ran, what it returned).
``replay_problems`` folds the events into the state they describe and lists every difference.

Covered (each exactly as the runtime writes it):
- run: agent, input, created_by, created_at (``run.created``); status; failure_code and
  failure_message (``run.failed``); output (``run.succeeded``); lease_owner and lease_epoch
  (``lease.taken``/``lease.taken_over``, cleared by ``lease.released``) and whether
  lease_expires_at is set at all; llm_requests (first attempts of ``llm.requested``);
  tokens_in/tokens_out (``llm.responded``); cost, within a micro-unit per response (see below);
  the number of planned calls (``llm.responded``'s ``decisions`` less the ``step.decided`` since).
- steps: the set of indexes, and per step: status, tool, arguments, effect, idempotency_key,
  result, error, attempt, dispatches, dispatched_attempt, started_at, finished_at.
- approvals: the set of ids (``approval.requested`` carries the id the row got), and per
  approval: step, kind, status, tool, arguments, effect, digest, title, decided_by,
  decided_at, note, result, created_at, consumed_at.

Not covered, on purpose:
- lease_expires_at's value: the statement's clock plus the lease, renewed by heartbeats, which
  write no event (only whether a lease is held is checked);
- cost exactly: PostgreSQL rounds each addition to the column's 6 places, SQLite sums floats;
  events hold each response's exact cost, so a difference beyond that rounding is reported;
- the planned calls' content: they are recorded only when each becomes a step (``step.decided``);
- updated_at (bookkeeping), event_seq/event_hash (``audit.verify``'s), approval detail
  (``approval.requested`` does not carry it).
JSON values are compared by canonical JSON, with whole floats taken as integers (the engines'
JSON types do not agree on ``1`` versus ``1.0``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from runtime.canonical import dumps, parse_time
from runtime.models import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    Event,
    FailureCode,
    Run,
    RunStatus,
    Step,
    StepStatus,
)

_COST_STEP = Decimal("0.000001")  # the cost column's last place
# Every kind replay knows the meaning of; an event of any other kind is reported, never
# skipped (a test keeps this equal to ``audit.EVENT_KINDS``).
REPLAYED_KINDS = frozenset({
    "run.created", "run.started", "run.resumed", "run.paused", "run.released", "run.succeeded",
    "run.failed", "run.cancelled", "lease.taken", "lease.taken_over", "lease.released",
    "step.started", "step.decided", "step.tool_started", "step.tool_dispatched",
    "step.tool_finished", "step.tool_failed", "step.interrupted", "llm.requested",
    "llm.responded", "llm.failed", "approval.requested", "approval.granted", "approval.rejected",
    "approval.resolved", "approval.consumed", "approval.cancelled", "reconcile.decided",
    "policy.denied", "side_effect.auto_confirmed", "approval.expired",
})


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
    lease_epoch: int = 0
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
    attempt: int = 0
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
    describe: the same transitions the loop, the claims and the operators' decisions make."""
    out = Replayed()
    run, steps, approvals = out.run, out.steps, out.approvals
    cancelled: list[ApprovalState] = []  # cancelled with the run, in the run's own commit
    for kind, idx, p, at in events:
        out.events += 1
        p = p if isinstance(p, dict) else {}
        if kind not in REPLAYED_KINDS:
            out.unreadable.append(f"event #{out.events} is of kind {kind!r}, which replay "
                                  "does not know: the rows cannot be vouched for")
            continue
        if kind not in ("approval.cancelled", "step.interrupted", "run.cancelled"):
            cancelled = []
        step = None if idx is None else steps.get(idx) or steps.setdefault(idx, StepState(idx))
        if kind == "run.created":
            run.created, run.status, run.created_at = True, RunStatus.QUEUED, at
            run.agent, run.input = p.get("agent", ""), p.get("input")
            run.created_by = p.get("created_by", "")
            origin = p.get("schedule") or {}
            run.schedule_id = origin.get("id")
            run.occurrence_at = parse_time(origin.get("occurrence"))
            run.authorized_at = parse_time(origin.get("authorized_at"))
        elif kind in ("run.started", "run.resumed"):
            run.status = RunStatus.RUNNING
        elif kind in ("lease.taken", "lease.taken_over"):
            run.lease_owner, run.lease_epoch, run.leased = p.get("owner", ""), p.get("epoch"), True
        elif kind == "lease.released":
            run.lease_owner, run.leased = "", False
        elif kind == "run.paused":
            run.status = RunStatus.WAITING
        elif kind in ("run.released", "approval.granted", "approval.resolved"):
            run.status = RunStatus.QUEUED
        elif kind == "run.succeeded":
            run.status, run.output, run.planned = RunStatus.SUCCEEDED, p.get("output"), 0
        elif kind == "run.failed":
            run.status, run.planned = RunStatus.FAILED, 0
            run.failure_code, run.failure_message = p.get("code", ""), p.get("message", "")
            _fail_deciding_step(steps, run, at)
        elif kind == "run.cancelled":
            run.status, run.planned = RunStatus.CANCELLED, 0
            for a in cancelled:  # api.cancel writes the canceller over the approval's decider
                a.decided_by, a.note, a.decided_at = p.get("by", ""), p.get("reason", ""), at
        elif kind == "llm.requested":
            if p.get("attempt", 1) == 1:  # a retry is the same request
                run.llm_requests += 1
        elif kind == "llm.responded":
            run.tokens_in += int(p.get("tokens_in", 0))
            run.tokens_out += int(p.get("tokens_out", 0))
            run.cost += Decimal(str(p.get("cost", "0")))  # written as str(Decimal)
            run.responses += 1
            run.planned = int(p.get("decisions", 1))
        if step is None:
            continue
        if kind == "step.started":
            step.status = StepStatus.DECIDING
            step.idempotency_key = p.get("idempotency_key", step.idempotency_key)
            if step.started_at is None:
                step.started_at = at
        elif kind == "step.decided":
            run.planned = max(run.planned - 1, 0)
            if p.get("final"):
                step.end(StepStatus.SUCCEEDED, at, result=p.get("output"))
            else:
                step.tool, step.arguments = p.get("tool", ""), p.get("arguments")
                step.effect = p.get("effect", "")
        elif kind == "step.tool_failed":
            step.end(StepStatus.FAILED, at, error=p.get("error", ""))
        elif kind == "policy.denied":
            step.end(StepStatus.FAILED, at, error=f"policy denied: {p.get('reason', '')}")
        elif kind == "llm.failed" and "retry_in" not in p:  # the last attempt fails the step
            step.end(StepStatus.FAILED, at, error=p.get("error", ""))
        elif kind == "step.tool_started":
            step.status, step.attempt = StepStatus.EXECUTING, p.get("attempt")
            step.dispatches = bool(p.get("dispatches", False))
        elif kind == "step.tool_dispatched":
            step.dispatched_attempt = p.get("attempt")
        elif kind == "step.tool_finished":
            step.end(StepStatus.SUCCEEDED, at, result=p.get("result"))
        elif kind == "step.interrupted":
            step.status = StepStatus.INTERRUPTED
        elif kind == "approval.requested":
            _requested(out, step, p, at)
        elif kind.startswith("approval."):
            a = approvals.get(p.get("approval_id"))
            if a is None:
                out.unreadable.append(f"{kind} names approval {p.get('approval_id')!r}, "
                                      "which no approval.requested created")
            else:
                _decided(a, step, kind, p, at)
                if kind == "approval.cancelled":
                    cancelled.append(a)
    return out


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


def _requested(out: Replayed, step: StepState, p: dict[str, Any], at: datetime) -> None:
    kind = p.get("kind", "")
    # A policy approval holds a step that never started; the others an interrupted one.
    step.status = StepStatus.WAITING if kind == ApprovalKind.POLICY else StepStatus.INTERRUPTED
    pk = p.get("approval_id")
    if not isinstance(pk, int):
        out.unreadable.append(f"approval.requested on step {step.index} carries no approval id")
        return
    out.approvals[pk] = ApprovalState(
        pk, step.index, kind, p.get("tool", ""), p.get("arguments"), p.get("effect", ""),
        p.get("digest", ""), str(p.get("title", ""))[:300], at,
        expires_at=parse_time(p.get("expires_at")))


def _decided(a: ApprovalState, step: StepState, kind: str, p: dict[str, Any],
             at: datetime) -> None:
    if kind in ("approval.granted", "approval.rejected", "approval.resolved"):
        a.status = {"approval.granted": ApprovalStatus.APPROVED,
                    "approval.rejected": ApprovalStatus.REJECTED,
                    "approval.resolved": ApprovalStatus.RESOLVED}[kind]
        a.decided_by, a.note, a.decided_at = p.get("decided_by", ""), p.get("note", ""), at
        if kind == "approval.resolved":
            a.result = p.get("result")
        if kind == "approval.rejected":
            step.end(StepStatus.REJECTED, at)
    elif kind == "approval.consumed":
        a.status, a.consumed_at = ApprovalStatus.CONSUMED, at
    elif kind == "approval.cancelled":
        a.status = ApprovalStatus.CANCELLED
    elif kind == "approval.expired":
        a.status, a.decided_at = ApprovalStatus.EXPIRED, at
        if step.status == StepStatus.WAITING:  # a policy question: the call never started
            step.end(StepStatus.FAILED, at, error=p.get("message", ""))


# -- comparing ----------------------------------------------------------------------------------

RUN_FIELDS = ("agent", "input", "created_by", "created_at", "status", "failure_code",
              "failure_message", "output", "lease_owner", "lease_epoch", "llm_requests",
              "tokens_in", "tokens_out", "schedule_id", "occurrence_at", "authorized_at")
STEP_FIELDS = ("status", "tool", "arguments", "effect", "idempotency_key", "result", "error",
               "attempt", "dispatches", "dispatched_attempt", "started_at", "finished_at")
APPROVAL_FIELDS = ("kind", "status", "tool", "arguments", "effect", "digest", "title",
                   "decided_by", "decided_at", "note", "result", "created_at", "consumed_at",
                   "expires_at")
JSON_FIELDS = frozenset({"input", "output", "arguments", "result"})


def replay_problems(run_id: int, using: str = "default") -> list[str]:
    """Differences between a run's rows (run, steps, approvals) and the state its events
    describe; empty when they agree. Each item is one line naming the row, the field, the
    recorded value and the value the events give."""
    row = Run.objects.using(using).filter(pk=run_id).first()
    if row is None:
        return [f"run {run_id}: no run row"]
    events = (Event.objects.using(using).filter(run_id=run_id).order_by("seq")
              .values_list("kind", "step_index", "payload", "at").iterator(chunk_size=2000))
    steps = list(Step.objects.using(using).filter(run_id=run_id))
    approvals = list(Approval.objects.using(using).filter(run_id=run_id))
    return replay_compare(row, events, steps, approvals)


def replay_compare(row: Run, events: Iterable[tuple[str, int | None, Any, datetime]],
                   step_rows: Iterable[Step], approval_rows: Iterable[Approval]) -> list[str]:
    """``replay_problems`` on rows already read: the run, its (kind, step_index, payload, at)
    events in sequence order, and all its steps and approvals (``verifyaudit`` reads many
    runs' rows in a few queries)."""
    run_id = row.pk
    state = replay_events(events)
    steps = {s.index: s for s in step_rows}
    approvals = {a.pk: a for a in approval_rows}
    where = f"run {run_id}"
    out = [f"{where}: {text}" for text in state.unreadable]
    if not state.run.created:
        out.append(f"{where}: no run.created event ({state.events} events)")
    out += _compare_run(where, row, state.run)
    index_of = {s.pk: i for i, s in steps.items()}
    for index in sorted(steps.keys() | state.steps.keys()):
        here = f"{where} step {index}"
        found, want = steps.get(index), state.steps.get(index)
        if want is None:
            out.append(f"{here}: a row ({found.status}, tool {found.tool!r}) that no event "
                       "describes")
        elif found is None:
            out.append(f"{here}: no row; the events give one ({want.status}, tool "
                       f"{want.tool!r})")
        else:
            out += _compare(here, found, want, STEP_FIELDS)
    for pk in sorted(approvals.keys() | state.approvals.keys()):
        here = f"{where} approval {pk}"
        found, want = approvals.get(pk), state.approvals.get(pk)
        if want is None:
            out.append(f"{here}: a row ({found.kind}, {found.status}) that no event describes")
        elif found is None:
            out.append(f"{here}: no row; the events give one ({want.kind}, {want.status})")
        else:
            step_index = index_of.get(found.step_id)
            if step_index != want.step_index:
                out.append(_line(here, "step", f"step id {found.step_id} (index {step_index})",
                                 f"index {want.step_index}"))
            out += _compare(here, found, want, APPROVAL_FIELDS)
    return out


def _compare_run(where: str, row: Run, want: RunState) -> list[str]:
    out = _compare(where, row, want, RUN_FIELDS)
    if (row.lease_expires_at is not None) != want.leased:
        out.append(_line(where, "lease_expires_at", _show(row.lease_expires_at),
                         "a time (a lease is held)" if want.leased else "None (no lease)"))
    try:
        cost = Decimal(row.cost)
    except (InvalidOperation, TypeError):
        cost = None
    if cost is None or abs(cost - want.cost) > _COST_STEP * max(want.responses, 1):
        out.append(_line(where, "cost", _show(row.cost), _show(want.cost)))
    planned = row.planned if isinstance(row.planned, list) else None
    if planned is None or len(planned) != want.planned:
        count = "not a list" if planned is None else f"{len(planned)} call(s)"
        out.append(_line(where, "planned", count, f"{want.planned} call(s)"))
    return out


def _compare(where: str, row: Any, want: Any, names: Iterable[str]) -> list[str]:
    out = []
    for name in names:
        recorded, expected = getattr(row, name), getattr(want, name)
        if name in JSON_FIELDS:
            if _canon(recorded) != _canon(expected):
                out.append(_line(where, name, _canon(recorded), _canon(expected)))
        elif recorded != expected:
            out.append(_line(where, name, _show(recorded), _show(expected)))
    return out


def _line(where: str, name: str, recorded: str, expected: str) -> str:
    return f"{where}: {name} is {_cut(recorded)} in the row; the events give {_cut(expected)}"


def _canon(value: Any) -> str:
    """Canonical JSON, whole floats as integers (so ``1.0`` from one engine equals ``1``)."""
    try:
        return dumps(_whole(value))
    except (TypeError, ValueError):
        return repr(value)


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_whole(v) for v in value]
    return value


def _show(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, str):
        value = str(value)  # a status enum shows as its value
    return repr(value)


def _cut(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
