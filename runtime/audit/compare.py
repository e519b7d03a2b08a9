"""Replay's verdict: a run's rows (run, steps, approvals) held against the state its events
describe (``runtime.audit.replay``), every difference one line.

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
  decided_at, note, result, created_at, consumed_at, and an edit of a policy call
  (``approval.edited``): effective_arguments, effective_digest, edited_by (and the step's
  arguments, which become the edited ones).

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
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from runtime.audit.replay import RunState, replay_events
from runtime.canonical import dumps
from runtime.models import (
    Approval,
    Event,
    Run,
    Step,
)

_COST_STEP = Decimal("0.000001")  # the cost column's last place


RUN_FIELDS = ("agent", "input", "created_by", "created_at", "status", "failure_code",
              "failure_message", "output", "lease_owner", "lease_epoch", "llm_requests",
              "tokens_in", "tokens_out", "schedule_id", "occurrence_at", "authorized_at",
              "restored_at")


STEP_FIELDS = ("status", "tool", "arguments", "effect", "idempotency_key", "result", "error",
               "attempt", "dispatches", "dispatched_attempt", "started_at", "finished_at")


APPROVAL_FIELDS = ("kind", "status", "tool", "arguments", "effect", "digest", "title",
                   "decided_by", "decided_at", "note", "result", "created_at", "consumed_at",
                   "expires_at", "effective_arguments", "effective_digest", "edited_by")


JSON_FIELDS = frozenset({"input", "output", "arguments", "result", "effective_arguments"})


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
        step, step_state = steps.get(index), state.steps.get(index)
        if step_state is None:
            assert step is not None, "the index is a row's or the events'"
            out.append(f"{here}: a row ({step.status}, tool {step.tool!r}) that no event "
                       "describes")
        elif step is None:
            out.append(f"{here}: no row; the events give one ({step_state.status}, tool "
                       f"{step_state.tool!r})")
        else:
            out += _compare(here, step, step_state, STEP_FIELDS)
    for pk in sorted(approvals.keys() | state.approvals.keys()):
        here = f"{where} approval {pk}"
        found, want = approvals.get(pk), state.approvals.get(pk)
        if want is None:
            assert found is not None, "the id is a row's or the events'"
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
