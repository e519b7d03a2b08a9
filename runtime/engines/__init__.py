"""One committer per engine: each executes a run's ``Plan`` as one commit.

``engine()`` gives the committer for the default connection's vendor. Both write the same
statements (``runtime.engines.sql``); they differ in how a commit is carried (SQLite: a lean
``BEGIN IMMEDIATE`` behind the writer queue; PostgreSQL: one statement of data-modifying CTEs,
a single round trip) and in whose clock judges a lease (PostgreSQL: the server's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Q

from ..audit import EventRow
from ..plan import Plan
from .sql import NOW, Dialect, NowPlus


class Refused(Exception):
    """The plan's fence no longer holds (or an approval it needs has moved): nothing written."""

    def __init__(self, reason: str = "fence", approval_id: int | None = None) -> None:
        self.reason, self.approval_id = reason, approval_id
        super().__init__(reason)


@dataclass
class Committed:
    """What a committed plan left: its events, the chain head, the lease expiry it set."""

    rows: list[EventRow]
    seq: int
    head: str
    expires_at: datetime | None = None


class Engine(Protocol):
    vendor: str
    locks_rows: bool  # claims lock the row (FOR UPDATE) rather than read and compare-and-set

    def commit(self, plan: Plan, clock: Any) -> Committed: ...

    def commit_many(self, plans: list[Plan], clock: Any) -> list[Committed | BaseException]:
        """Several plans at once (SQLite: one transaction); each one's result or error."""

    def apply_in_tx(self, plan: Plan, clock: Any) -> Committed: ...

    def transaction(self) -> Any: ...

    def one_write(self) -> Any:
        """Around a single write statement outside any transaction: SQLite queues it for the
        write lock like every writer; PostgreSQL runs it as it comes (one round trip)."""

    def renew(self, leases: list[Any], seconds: float, clock: Any) -> dict[tuple, datetime]:
        """Renew in one statement; (run id, epoch, owner) -> new expiry of those renewed."""

    def select(self, sql: str, params: list[Any]) -> list[tuple]:
        """The rows of a read the runtime built (``%s`` placeholders), with no ORM around."""

    def now_expression(self, clock: Any) -> Any: ...

    def dialect(self, clock: Any) -> Dialect:
        """How this engine writes statements judged by ``clock`` (``runtime.engines.sql``)."""

    def notify_ready(self) -> None: ...


def commit_each(engine: Engine, plans: list[Plan], clock: Any) -> list[Committed | BaseException]:
    """Each plan in a commit of its own; each plan's result, or ``Refused``."""
    out: list[Committed | BaseException] = []
    for plan in plans:
        try:
            out.append(engine.commit(plan, clock))
        except Refused as refused:
            out.append(refused)
    return out


def database_time(clock: Any) -> bool:
    """Whether leases are judged by the database server's own clock (the system clock on an
    engine that has one) rather than by ``clock``'s value (an injected test clock)."""
    return bool(getattr(clock, "database_time", False))


def fill(params: list[Any], now: datetime, adapt: Any, marks: Sequence[int]) -> list[Any]:
    """``params`` with the statement-time markers at ``marks`` replaced by ``now`` (read in
    the transaction), adapted for the engine."""
    out = list(params)
    for i in marks:
        p = out[i]
        if p is NOW:
            out[i] = adapt(now)
        elif isinstance(p, NowPlus):
            out[i] = adapt(now + timedelta(seconds=p.seconds))
    return out


_engines: dict[str, Engine] = {}


def engine(using: str = DEFAULT_DB_ALIAS) -> Engine:
    """The committer for the connection's vendor (one instance per vendor)."""
    vendor = connections[using].vendor
    found = _engines.get(vendor)
    if found is None:
        if vendor == "postgresql":
            from .postgres import PostgresEngine

            found = PostgresEngine()
        elif vendor == "sqlite":
            from .sqlite import SqliteEngine

            found = SqliteEngine()
        else:
            raise NotImplementedError(f"the runtime supports SQLite and PostgreSQL, not {vendor}")
        _engines[vendor] = found
    return found


def write_approvals_in_tx(plan: Plan) -> None:
    """The plan's approval rows (moves first: a new approval of a step needs the old one
    moved), and the notifications they call for, in the caller's transaction: the outbox is
    written with the approval's own events or not at all."""
    from ..models import Approval
    from ..outbox import event_of_move, outbox_enqueue_in_tx

    move_approvals(plan)
    if plan.approval_create is not None:
        draft = plan.approval_create
        draft.payload["approval_id"] = Approval.objects.create(**draft.fields).pk
        outbox_enqueue_in_tx(draft.payload["approval_id"], "approval.requested", plan.at)
    for move in plan.approval_moves:
        event = event_of_move(move.fields.get("status", ""))
        if event is not None:
            outbox_enqueue_in_tx(move.pk, event, plan.at)


def move_approvals(plan: Plan) -> None:
    """The plan's approval compare-and-sets, in the caller's transaction (rare: a pause, a
    consumption, a decision; through the ORM on both engines)."""
    from ..models import Approval

    for move in plan.approval_moves:
        found = Approval.objects.filter(pk=move.pk, status=move.from_status)
        if move.open_at is not None:
            found = found.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=move.open_at))
        if move.expired_by is not None:
            found = found.filter(expires_at__lte=move.expired_by)
        moved = found.update(**move.fields)
        if move.required and moved != 1:
            raise Refused(f"approval {move.pk} is no longer {move.from_status}", move.pk)
