"""A run's transition as data: everything one commit writes, and the condition it is written on.

A ``Plan`` holds the commit's events, the run row's new values, the step rows it inserts or
updates, the approval rows it creates or moves, and its ``Fence``: the compare-and-set that
decides whether the commit happens at all (chain head, lease owner and epoch, run status, and
whether the lease must be unexpired or expired at the statement itself). Deciding what a
transition is happens in the loop (``runtime.transitions``); how it is written is the engine's
committer (``runtime.storage.engines``). A plan knows nothing of SQL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from runtime.crashpoints import CrashPoint
from runtime.models import Step, StepStatus
from runtime.storage.events import EventSpec

# Events that start something outside (an LLM request, a tool call, a dispatch) need the lease
# unexpired at the fencing statement, not only held.
GATED = frozenset({"llm.requested", "step.tool_started", "step.tool_dispatched"})


@dataclass(frozen=True)
class Add:
    """A run counter's increment: written as ``column = column + n`` (no read first)."""

    n: int | Decimal


@dataclass(frozen=True)
class Fence:
    """What the run row must still say for the commit to happen (compare-and-set).

    ``seq`` is the audit chain head every commit checks, so appends stay gapless. ``owner`` and
    ``epoch`` fence a lease holder's writes; ``status`` fences claims and operator decisions;
    ``unexpired``/``expired`` compare the lease's expiry with the time at the statement itself
    (the database server's clock on PostgreSQL).
    """

    seq: int
    owner: str | None = None
    epoch: int | None = None
    status: tuple[str, ...] = ()
    unexpired: bool = False
    expired: bool = False


@dataclass(frozen=True)
class TakeLease:
    """The lease a claim or takeover takes: expiry is the statement's time plus ``seconds``."""

    owner: str
    epoch: int
    seconds: float


@dataclass
class ApprovalDraft:
    """An approval row to insert; its id goes into ``payload`` (an event's) before hashing."""

    fields: dict[str, Any]
    payload: dict[str, Any]


@dataclass(frozen=True)
class ApprovalMove:
    """An approval's compare-and-set from ``from_status``; ``required`` ones refuse the commit
    when they find nothing to move."""

    pk: int
    from_status: str
    fields: dict[str, Any]
    required: bool = True
    # A decision must come before the approval's deadline (``open_at`` is the decision's time);
    # an expiry only after it (``expired_by``).
    open_at: datetime | None = None
    expired_by: datetime | None = None


@dataclass(frozen=True)
class StandingGuard:
    """A schedule's standing authorization that let this commit start a side effect: checked
    again inside the commit's transaction (the schedule row locked where rows lock), so one
    turned off in the instant before cannot let a start through."""

    schedule_id: int
    authorized_at: datetime


@dataclass
class Plan:
    """One commit of one run: its events and row changes, and the fence they are written on."""

    run_id: int
    at: datetime
    actor: str
    fence: Fence
    head: str  # the chain's hash at ``fence.seq``
    events: list[EventSpec] = field(default_factory=list)
    run: dict[str, Any] = field(default_factory=dict)
    take: TakeLease | None = None
    step_inserts: list[Step] = field(default_factory=list)
    step_updates: dict[int, tuple[Step, dict[str, Any]]] = field(default_factory=dict)
    approval_create: ApprovalDraft | None = None
    approval_moves: list[ApprovalMove] = field(default_factory=list)
    standing: StandingGuard | None = None
    after: list[tuple[CrashPoint, int | None]] = field(default_factory=list)

    @property
    def in_orm(self) -> bool:
        """Whether the commit writes or reads rows through the ORM in its transaction (an
        approval, a standing authorization): not one for the lean or grouped paths."""
        return (self.approval_create is not None or bool(self.approval_moves)
                or self.standing is not None)

    def event(self, kind: str, payload: dict[str, Any], step: int | None = None, *,
              actor: str | None = None) -> dict:
        self.events.append(EventSpec(kind, payload, step, actor))
        return payload

    @property
    def gated(self) -> bool:
        """Whether an outside call follows this commit (it needs an unexpired lease)."""
        return any(spec.kind in GATED for spec in self.events)

    @property
    def releases(self) -> bool:
        """Whether the commit gives the lease up (pause, release, end)."""
        return "lease_owner" in self.run and not self.run["lease_owner"]

    def step_insert(self, step: Step) -> None:
        self.step_inserts.append(step)

    def step_update(self, step: Step, **fields: Any) -> None:
        """Change ``step`` now and write it in the commit: one write per step per commit
        (a step inserted by this plan is written whole by its insert)."""
        for name, value in fields.items():
            setattr(step, name, value)
        if any(s is step for s in self.step_inserts):
            return
        pending = self.step_updates.get(id(step))
        if pending is None:
            self.step_updates[id(step)] = (step, dict(fields))
        else:
            pending[1].update(fields)

    def approval_move(self, pk: int, from_status: str, required: bool = True, *,
                      open_at: datetime | None = None, expired_by: datetime | None = None,
                      **fields: Any) -> None:
        self.approval_moves.append(ApprovalMove(pk, from_status, fields, required, open_at,
                                                expired_by))

    def mark(self) -> tuple[int, dict[int, tuple[Step, dict[str, Any]]], int]:
        """Where the plan stands now, for ``rewind`` (events, step updates, crash points)."""
        return (len(self.events), {k: (v[0], dict(v[1])) for k, v in self.step_updates.items()},
                len(self.after))

    def rewind(self, mark: tuple[int, dict[int, tuple[Step, dict[str, Any]]], int]) -> None:
        """Drop what was added since ``mark`` (a commit refused for a reason that leaves the
        rest of the transition to be written another way). Step objects keep their fields:
        the caller puts back what it changed."""
        events, updates, after = mark
        del self.events[events:]
        self.step_updates = updates
        del self.after[after:]
        self.standing = None

    def crash_after(self, point: CrashPoint, step: int | None) -> None:
        self.after.append((point, step))

    def last_step_index(self) -> int | None:
        return next((s.step_index for s in reversed(self.events) if s.step_index is not None),
                    None)


def interrupt_step(plan: Plan, step: Step, **why: Any) -> None:
    """Mark the step in flight interrupted: its outcome is unknown to this record (§7)."""
    plan.event("step.interrupted", {
        "was": step.status, "tool": step.tool, "effect": step.effect, "attempt": step.attempt,
        "dispatched": step.attempt > 0 and step.dispatched_attempt == step.attempt, **why,
    }, step.index)
    plan.step_update(step, status=StepStatus.INTERRUPTED)
