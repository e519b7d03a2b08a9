"""One committer per engine: each executes a run's ``Plan`` as one commit.

``engine()`` gives the committer for the default connection's vendor. Both write the same
statements (``runtime.storage.sql``); they differ in how a commit is carried (SQLite: a lean
``BEGIN IMMEDIATE`` behind the writer queue; PostgreSQL: one statement of data-modifying CTEs,
a single round trip) and in whose clock judges a lease (PostgreSQL: the server's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from runtime.storage.events import EventRow
from runtime.storage.plan import Plan
from runtime.storage.sql import NOW, Dialect, NowPlus


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
    groups_commits: bool  # ``commit_many`` writes its plans in one transaction

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
        """How this engine writes statements judged by ``clock`` (``runtime.storage.sql``)."""

    def notify_ready(self) -> None: ...

    def worker_storage(self, threads: int) -> WorkerStorage:
        """What a worker process of ``threads`` threads runs beside its runs on this engine."""


class ReadyWatch(Protocol):
    """How an idle worker hears that a run became ready: PostgreSQL's notifications on a
    socket, or SQLite's count of other connections' commits, looked at now and then."""

    poll_seconds: float  # the longest wait between looks without a socket to wait on

    def mark(self) -> None:
        """Before a claim: note what has been seen, so a commit during the claim is news."""

    def fileno(self) -> int | None:
        """A socket that becomes readable with news, or None (look every ``poll_seconds``)."""

    def news(self, *, readable: bool, woken: bool, wanted: bool) -> bool:
        """After a wait: whether a run may have become ready since ``mark``, worth a claim
        now (``wanted``: a slot is free and the last claim found less than it asked for)."""

    def close(self) -> None: ...


class WorkerStorage(Protocol):
    """A worker process's engine-specific services: started before its first claim, stopped
    after its last run (``stop`` returns what the stop line adds about them)."""

    @property
    def watch(self) -> ReadyWatch:
        """Read-only here, so each engine may keep its own kind of watch."""

    def start(self) -> None: ...

    def stop(self) -> str: ...


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
