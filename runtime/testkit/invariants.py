"""The six invariants of design §11, checked against the database once it is quiet.

Side-effect executions come from the outside world's own record (``executions``, e.g.
``Ledger.executions()``), never from the runtime's tables: the point is to catch a runtime that
believes it ran a call once while the world saw it twice.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from runtime.approvals.rules import approval_resolvable
from runtime.audit.chain import verify
from runtime.clock import SYSTEM_CLOCK
from runtime.effects import Effect
from runtime.errors import InvariantViolation
from runtime.models import (
    Approval,
    ApprovalStatus,
    Event,
    Run,
    RunStatus,
    Step,
    StepStatus,
)
from runtime.testkit.reached import Reached

_ENDS_AN_ATTEMPT = ("step.tool_finished", "step.tool_failed", "step.interrupted")


@dataclass(frozen=True)
class Violation:
    """One broken invariant, with the run, step and events that show it."""

    invariant: int
    run_id: int | None
    step_index: int | None
    message: str
    events: tuple[int, ...] = ()

    def __str__(self) -> str:
        where = f"run {self.run_id}" if self.run_id is not None else "kit"
        if self.step_index is not None:
            where += f" step {self.step_index}"
        seqs = f" (events #{', #'.join(map(str, self.events))})" if self.events else ""
        return f"invariant {self.invariant}: {where}: {self.message}{seqs}"


@dataclass
class Report:
    """What was checked, for tables and soak summaries."""

    runs: int = 0
    steps: int = 0
    events: int = 0
    side_effect_executions: int = 0
    approvals_consumed: int = 0
    violations: list[Violation] = field(default_factory=list)


def check_invariants(
    db: str = "default",
    *,
    executions: Mapping[tuple[int, int], int],
    reached: Reached | None = None,
    runs: Iterable[int] | None = None,
    now: datetime | None = None,
    raise_on_violation: bool = True,
) -> Report:
    """Check every invariant of design §11 for ``runs`` (default: all) in database ``db``.

    ``executions`` maps (run id, step index) to how many times the outside world saw that
    step's call take effect. Raises ``InvariantViolation`` listing every violation found.
    """
    now = now or SYSTEM_CLOCK.now()
    run_qs = Run.objects.using(db).order_by("pk")
    if runs is not None:
        run_qs = run_qs.filter(pk__in=list(runs))
    report = Report()
    out = report.violations
    for run in run_qs.iterator(chunk_size=500):
        events = list(Event.objects.using(db).filter(run_id=run.pk).order_by("seq"))
        steps = {s.index: s for s in Step.objects.using(db).filter(run_id=run.pk)}
        approvals = list(Approval.objects.using(db).filter(run_id=run.pk).select_related("step"))
        report.runs += 1
        report.steps += len(steps)
        report.events += len(events)
        report.approvals_consumed += sum(a.status == ApprovalStatus.CONSUMED for a in approvals)
        report.side_effect_executions += sum(
            executions.get((run.pk, i), 0) for i, s in steps.items()
            if s.effect == Effect.SIDE_EFFECT)
        out += _side_effects_bounded(run, steps, approvals, executions)
        out += _approvals_consumed_once(run, events, approvals)
        out += _every_start_ends(run, events)
        out += _nothing_in_flight(run, steps, now)
        out += _chain_and_replay(run, db)
    if reached is not None:
        out += [Violation(5, m.run_id, m.step_index, f"requested crash {m.point} was never "
                          f"reached{': ' + m.detail if m.detail else ''}")
                for m in reached.missing()]
    if out and raise_on_violation:
        raise InvariantViolation(out)
    return report


def _side_effects_bounded(run: Run, steps: dict[int, Step], approvals: list[Approval],
                          executions: Mapping[tuple[int, int], int]) -> list[Violation]:
    """1. A side-effect step executes at most 1 + (re-run approvals consumed for it) times."""
    # A consumed approval about an interrupted call authorized one execution beyond the first
    # (a policy approval authorized the first one).
    consumed: Counter[int] = Counter(
        a.step.index for a in approvals
        if a.status == ApprovalStatus.CONSUMED and approval_resolvable(a))
    found = []
    for index, step in steps.items():
        seen = executions.get((run.pk, index), 0)
        allowed = 1 + consumed[index]
        if step.effect == Effect.SIDE_EFFECT and seen > allowed:
            found.append(Violation(1, run.pk, index, f"{step.tool} took effect {seen} times "
                                   f"outside; only {allowed} executions were authorized "
                                   f"({consumed[index]} re-run approvals consumed)"))
    return found


def _approvals_consumed_once(run: Run, events: list[Event],
                             approvals: list[Approval]) -> list[Violation]:
    """2. An approval is consumed at most once, and each consumption starts the request once."""
    found = []
    by_id: dict[Any, list[Event]] = defaultdict(list)
    for i, e in enumerate(events):
        if e.kind != "approval.consumed":
            continue
        by_id[e.payload.get("approval_id")].append(e)
        after = events[i + 1] if i + 1 < len(events) else None
        if after is None or after.kind != "step.tool_started" or after.step_index != e.step_index:
            found.append(Violation(2, run.pk, e.step_index, "an approval was consumed without "
                                   "starting its request in the same commit", (e.seq,)))
    for approval_id, consumed in by_id.items():
        if len(consumed) > 1:
            found.append(Violation(2, run.pk, consumed[0].step_index, f"approval "
                                   f"{approval_id} was consumed {len(consumed)} times",
                                   tuple(e.seq for e in consumed)))
    for a in approvals:
        n = len(by_id.get(a.pk, []))
        if (a.status == ApprovalStatus.CONSUMED) != (n == 1):
            found.append(Violation(2, run.pk, a.step.index, f"approval {a.pk} is {a.status} "
                                   f"but its consumption was recorded {n} times"))
    return found


def _every_start_ends(run: Run, events: list[Event]) -> list[Violation]:
    """3. Every ``step.tool_started`` is followed by its attempt's end or interruption."""
    if run.status == RunStatus.RUNNING:
        return []  # not quiet: the attempt may be in flight right now
    found = []
    for i, e in enumerate(events):
        if e.kind != "step.tool_started":
            continue
        attempt = e.payload.get("attempt")
        ended = any(
            later.kind in _ENDS_AN_ATTEMPT and later.step_index == e.step_index
            and later.payload.get("attempt", attempt) == attempt
            for later in events[i + 1:])
        if not ended:
            found.append(Violation(3, run.pk, e.step_index, f"attempt {attempt} started and "
                                   "never finished, failed or was interrupted", (e.seq,)))
    return found


def _nothing_in_flight(run: Run, steps: dict[int, Step], now: datetime) -> list[Violation]:
    """4. Once quiet: no step deciding/executing, no run ``running`` without a live lease."""
    found = []
    if run.status == RunStatus.RUNNING:
        if run.lease_expires_at is None or run.lease_expires_at <= now or not run.lease_owner:
            found.append(Violation(4, run.pk, None, f"running without a live lease (owner "
                                   f"{run.lease_owner!r}, expires {run.lease_expires_at})"))
        return found
    for index, step in steps.items():
        if step.status == StepStatus.EXECUTING or (
                step.status == StepStatus.DECIDING and run.status != RunStatus.QUEUED):
            found.append(Violation(4, run.pk, index, f"step left {step.status} in a "
                                   f"{run.status} run"))
    return found


def _chain_and_replay(run: Run, db: str) -> list[Violation]:
    """6. Events gapless, hash chain intact, and replaying them gives the run's rows
    (``runtime.audit.replay``, the same check ``verifyaudit`` makes)."""
    checked = verify(run, using=db)
    if checked.ok:
        return []
    return [Violation(6, run.pk, None, checked.reason, (checked.broken_seq or 0,))]
