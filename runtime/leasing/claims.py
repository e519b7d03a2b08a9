"""Taking and handing back a run's lease: claim a queued run, take over one whose owner is gone,
release one from outside its loop.

A claim is one transaction: the run row is locked (PostgreSQL: ``FOR UPDATE``, and ``SKIP
LOCKED`` when any runnable run will do, so N workers claim N different runs; SQLite: the write
lock), judged by the database's time, and moved by its plan in the same transaction. Nobody can
change the row between the look and the write, and the plan's compare-and-set checks it again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from django.db import connection
from django.db.models.query import RawQuerySet

from runtime import crashpoints
from runtime.canonical import iso_time_or_none
from runtime.clock import SYSTEM_CLOCK
from runtime.crashpoints import CrashPoint
from runtime.errors import LeaseLost, RunLeased, RunNotFound, RunNotResumable
from runtime.leasing.lease import Lease, lease_commit, lease_plan
from runtime.models import IN_FLIGHT_STEP_STATUSES, Run, RunStatus, Step
from runtime.storage.base import Refused
from runtime.storage.engines import engine, lease_expired
from runtime.storage.events import log_events
from runtime.storage.plan import Fence, Plan, TakeLease, interrupt_step
from runtime.storage.protocol import protocol_check
from runtime.storage.sql import Statement, claim_candidates

if TYPE_CHECKING:
    from typing import TypeAlias, TypedDict

    from django_stubs_ext import WithAnnotations

    class _Expired(TypedDict):
        expired: bool

    # A run read for a claim, with whether its lease had expired by the database's time.
    RunWithExpiry: TypeAlias = WithAnnotations[Run, _Expired]


@dataclass
class Acquired:
    """The outcome of a claim: the lease, the run as claimed, and what happened."""

    lease: Lease
    run: Run
    taken_over: bool
    resumed: bool
    interrupted_step: int | None


def _with_expiry(runs: Any, clock: Any) -> Any:
    """Annotate whether each run's lease has expired, by the database's time."""
    return runs.annotate(expired=lease_expired(clock))


def run_acquire(
    run_id: int,
    owner: str,
    *,
    lease_seconds: float,
    clock: Any = SYSTEM_CLOCK,
    owner_is_dead: Callable[[Run], bool] | None = None,
) -> Acquired:
    """Take this run's lease: claim it if queued, take it over if its lease has expired (or
    its owner is proved dead). A live lease held by anyone raises ``RunLeased``, changing
    nothing."""
    protocol_check()
    eng = engine()
    with eng.transaction() if eng.locks_rows else nullcontext():
        runs = Run.objects.select_for_update() if eng.locks_rows else Run.objects
        try:
            run = _with_expiry(runs, clock).get(pk=run_id)
        except (Run.DoesNotExist, ValueError, TypeError):
            raise RunNotFound(run_id) from None
        if run.status == RunStatus.RUNNING:
            # Proof of death is asked for even once the lease has expired: it tells the
            # interruption contract that the old call can no longer take effect (recovery).
            dead = owner_is_dead is not None and owner_is_dead(run)
            if not run.expired and not dead:
                raise RunLeased(run.pk, run.lease_owner, run.lease_expires_at)
            reason = "owner proved dead" if dead else ""
        elif run.status == RunStatus.QUEUED:
            reason = ""
        else:
            raise RunNotResumable(run.pk, run.status)
        try:
            return _take(run, owner, lease_seconds, clock, reason=reason, locked=eng.locks_rows)
        except _Lost:
            raise _lost_race(run.pk, clock) from None


def run_claim_next(
    owner: str,
    *,
    lease_seconds: float,
    clock: Any = SYSTEM_CLOCK,
    agents: Sequence[str] | None = None,
    dead_owners: Sequence[str] = (),
    exclude: Sequence[int] = (),
    on_conflict: Callable[[], None] | None = None,
) -> Acquired | None:
    """Claim the next runnable run, or None (``run_claim_many`` for one run)."""
    found = run_claim_many(owner, 1, lease_seconds=lease_seconds, clock=clock, agents=agents,
                           dead_owners=dead_owners, exclude=exclude, on_conflict=on_conflict)
    return found[0] if found else None


def run_claim_many(
    owner: str,
    n: int,
    *,
    lease_seconds: float,
    clock: Any = SYSTEM_CLOCK,
    agents: Sequence[str] | None = None,
    dead_owners: Sequence[str] = (),
    exclude: Sequence[int] = (),
    on_conflict: Callable[[], None] | None = None,
) -> list[Acquired]:
    """Claim up to ``n`` runnable runs in one transaction: runs whose lease expired or whose
    owner is proved dead first (their steps wait), then queued runs, oldest first.

    PostgreSQL locks the rows it claims (``FOR UPDATE SKIP LOCKED``): workers never race for
    one. SQLite has one writer: the runs are read outside the write lock, and each claim's
    compare-and-set decides (all of them in one group commit); ``on_conflict`` hears of each
    claim another worker won first, and up to ``CANDIDATES`` rounds look again for the runs
    lost that way.

    ``agents``: only runs of these agents, queued or to take over (a worker passes the agents
    it has, so a run of one it lacks waits for a worker that has it; an empty list claims
    nothing); None: runs of any agent.
    """
    protocol_check()
    if agents is not None and not agents:
        return []
    eng = engine()
    out: list[Acquired] = []
    if eng.locks_rows:
        with eng.transaction():
            for gone in (True, False):
                if len(out) >= n:
                    break
                for run in _candidates(clock, gone, n - len(out), agents or (), dead_owners,
                                       exclude, lock=True):
                    try:
                        out.append(_take(run, owner, lease_seconds, clock,
                                         reason=_why(run, dead_owners), locked=True))
                    except _Lost:  # the locked row's fence refused (the server's clock
                        if on_conflict is not None:  # stepped back): nothing of it written
                            on_conflict()
        return out
    for gone in (True, False):
        lost: list[int] = []
        for _ in range(CANDIDATES):
            want = n - len(out)
            if want <= 0:
                return out
            candidates = _candidates(clock, gone, want, agents or (), dead_owners,
                                     [*exclude, *lost])
            if not candidates:
                break
            taken = _take_many(candidates, owner, lease_seconds, clock, dead_owners)
            for run, got in zip(candidates, taken, strict=True):
                if got is None:
                    lost.append(run.pk)
                    if on_conflict is not None:
                        on_conflict()
                else:
                    out.append(got)
            if len(candidates) < want or not lost:
                break
    return out


CANDIDATES = 3  # SQLite: runs tried per claim before the worker looks again


def _why(run: RunWithExpiry, dead_owners: Sequence[str]) -> str:
    """Why a running run may be taken (a queued one is simply claimed): its owner proved dead
    (expired or not), else its lease expired ("")."""
    if run.status == RunStatus.QUEUED:
        return ""
    return "owner proved dead" if run.lease_owner in dead_owners or not run.expired else ""


class _Lost(Exception):
    """The claim's compare-and-set found the run changed since it was read."""


def _lost_race(run_id: int, clock: Any) -> Exception:
    """What someone else's change between our read and our claim left: the error to raise."""
    run = _with_expiry(Run.objects, clock).get(pk=run_id)
    if run.status == RunStatus.RUNNING and not run.expired:
        return RunLeased(run.pk, run.lease_owner, run.lease_expires_at)
    return RunNotResumable(run.pk, f"{run.status} (changed while claiming)")


def runnable(clock: Any = SYSTEM_CLOCK, *, agents: Sequence[str] = (),
             dead_owners: Sequence[str] = (), exclude: Sequence[int] = (),
             limit: int = 1) -> list[RawQuerySet]:
    """Where a worker looks for a run to claim, in order: runs whose lease expired or whose
    owner is proved dead (their steps wait), then queued runs, oldest first. Two queries, each
    read along its (status, ...) index whatever the number of finished runs."""
    return [Run.objects.raw(stmt.sql, stmt.params) for stmt in (
        _looking(clock, gone, limit, agents, dead_owners, exclude) for gone in (True, False))]


def _looking(clock: Any, gone: bool, limit: int, agents: Sequence[str],
             dead_owners: Sequence[str], exclude: Sequence[int],
             lock: bool = False) -> Statement:
    """One of ``runnable``'s two queries, up to ``limit`` runs; ``lock``: locked, skipping
    those another worker holds (PostgreSQL). One statement built per call, no ORM query
    compiled: a busy worker claims many times a second."""
    return claim_candidates(engine().dialect(clock), clock.now(), gone=gone, limit=limit,
                            agents=agents, dead_owners=dead_owners, exclude=exclude, lock=lock)


def _candidates(clock: Any, gone: bool, limit: int, agents: Sequence[str],
                dead_owners: Sequence[str], exclude: Sequence[int],
                lock: bool = False) -> list[RunWithExpiry]:
    """``_looking``'s runs, read with a plain cursor: a raw queryset works out its columns,
    their converters and its model's field order on every call, more than the query itself
    costs, and a worker claims once or more per finished run."""
    stmt = _looking(clock, gone, limit, agents, dead_owners, exclude, lock)
    return [_run_from_row(row) for row in engine().select(stmt.sql, stmt.params)]


_RUN_FIELDS = Run._meta.concrete_fields  # the order of RUN_SELECT's columns
_RUN_NAMES = [f.attname for f in _RUN_FIELDS]
_converters: dict[tuple[str, str], list[tuple[int, Any, list[Any]]]] = {}


def _run_converters() -> list[tuple[int, Any, list[Any]]]:
    """(column position, column, the backend's and the field's converters) for each column
    of a run that needs converting, as the ORM would apply them; worked out once per
    database."""
    key = (connection.alias, connection.vendor)
    found = _converters.get(key)
    if found is None:
        found = []
        for i, f in enumerate(_RUN_FIELDS):
            col = f.get_col(Run._meta.db_table)
            # Field.get_db_converters is Django's own; django-stubs do not declare it.
            convs = (connection.ops.get_db_converters(col)
                     + f.get_db_converters(connection))  # type: ignore[attr-defined]
            if convs:
                found.append((i, col, convs))
        _converters[key] = found
    return found


def _run_from_row(row: Sequence[Any]) -> RunWithExpiry:
    """A run from a row of RUN_SELECT's columns followed by ``expired``."""
    values = list(row[:len(_RUN_NAMES)])
    for i, col, convs in _run_converters():
        for convert in convs:
            values[i] = convert(values[i], col, connection)
    run = cast("RunWithExpiry", Run.from_db(connection.alias, _RUN_NAMES, values))
    run.expired = bool(row[len(_RUN_NAMES)])
    return run


def _take(run: Run, owner: str, seconds: float, clock: Any, *, reason: str,
          locked: bool) -> Acquired:
    """Claim (queued) or take over (running) ``run``: in the caller's transaction when it has
    locked the row, else in a commit of its own whose fence raises ``_Lost`` if the run moved."""
    plan, step = _claim_plan(run, owner, seconds, clock, reason)
    try:
        committed = (engine().apply_in_tx(plan, clock) if locked
                     else engine().commit(plan, clock))
    except Refused:
        raise _Lost() from None
    return _claimed(run, plan, step, committed, seconds)


def _take_many(runs: list[RunWithExpiry], owner: str, seconds: float, clock: Any,
               dead_owners: Sequence[str]) -> list[Acquired | None]:
    """Claim or take over each of ``runs`` in one commit (SQLite); None where the run moved.
    A database fault raises (whether the commit landed is unknown: those leases expire)."""
    plans = [_claim_plan(run, owner, seconds, clock, _why(run, dead_owners)) for run in runs]
    out: list[Acquired | None] = []
    for run, (plan, step), result in zip(runs, plans, engine().commit_many(
            [plan for plan, _step in plans], clock), strict=True):
        if isinstance(result, Refused):
            out.append(None)
        elif isinstance(result, BaseException):
            raise result
        else:
            out.append(_claimed(run, plan, step, result, seconds))
    return out


def _claim_plan(run: Run, owner: str, seconds: float, clock: Any,
                reason: str) -> tuple[Plan, Step | None]:
    """The commit that claims or takes over ``run``, and the step it marks interrupted."""
    epoch = run.lease_epoch + 1
    plan = Plan(run_id=run.pk, at=clock.now(), actor=owner, head=run.event_hash,
                fence=Fence(seq=run.event_seq, epoch=run.lease_epoch, status=(run.status,),
                            expired=run.status == RunStatus.RUNNING and not reason),
                take=TakeLease(owner, epoch, seconds), run={"status": RunStatus.RUNNING})
    step = None
    resumed = run.status == RunStatus.RUNNING or run.lease_epoch > 0
    if run.status == RunStatus.RUNNING:
        step = _in_flight(run.pk)
        plan.event("lease.taken_over", {
            "owner": owner, "epoch": epoch, "lease_seconds": seconds,
            "previous_owner": run.lease_owner, "previous_epoch": run.lease_epoch,
            "previous_expires_at": iso_time_or_none(run.lease_expires_at),
            "reason": reason or "lease expired"})
        plan.event("run.resumed", {"owner": owner, "after": "takeover"})
        if step is not None:
            interrupt_step(plan, step, previous_owner=run.lease_owner,
                           previous_owner_dead=bool(reason))
    else:
        plan.event("lease.taken", {"owner": owner, "epoch": epoch, "lease_seconds": seconds})
        plan.event("run.resumed" if resumed else "run.started", {"owner": owner})
    return plan, step


def _claimed(run: Run, plan: Plan, step: Step | None, committed: Any,
             seconds: float) -> Acquired:
    """The lease a committed claim gave, and ``run`` as it now is."""
    taken_over = run.status == RunStatus.RUNNING
    resumed = taken_over or run.lease_epoch > 0
    log_events(committed.rows)
    owner, epoch = plan.take.owner, plan.take.epoch  # type: ignore[union-attr]
    run.status, run.lease_owner, run.lease_epoch = RunStatus.RUNNING, owner, epoch
    run.lease_expires_at, run.event_seq, run.event_hash = (committed.expires_at, committed.seq,
                                                           committed.head)
    lease = Lease(run.pk, owner, epoch, committed.expires_at, (committed.seq, committed.head),
                  seconds=seconds)
    return Acquired(lease, run, taken_over, resumed, step.index if step is not None else None)


def acquired_crash_points(acquired: Acquired) -> None:
    """The crash points of a claim, reached after its commit."""
    run_id, step = acquired.run.pk, acquired.interrupted_step
    if acquired.resumed:
        crashpoints.reached(CrashPoint.AFTER_RUN_RESUMED, run_id=run_id, step_index=step)
    if step is not None:
        crashpoints.reached(CrashPoint.AFTER_STEP_INTERRUPTED, run_id=run_id, step_index=step)


def run_release(lease: Lease, *, clock: Any = SYSTEM_CLOCK, reason: str) -> bool:
    """Hand a run back to the queue from outside its loop (a stopping worker past its grace
    period). A step still in flight is marked interrupted in the same transaction, so whoever
    claims the run next applies the interruption contract to it. False if the lease was gone."""
    plan = lease_plan(lease, clock.now())  # first: the loop moving on makes its fence refuse
    step = _in_flight(lease.run_id)
    if step is not None:
        interrupt_step(plan, step, reason=reason)
    plan.event("run.released", {"reason": reason})
    plan.event("lease.released", {"owner": lease.owner, "epoch": lease.epoch})
    plan.run.update(status=RunStatus.QUEUED, lease_owner="", lease_expires_at=None)
    try:
        lease_commit(lease, plan, clock)
    except LeaseLost:
        return False
    return True


def _in_flight(run_id: int) -> Step | None:
    """The step a dead or stopping owner left deciding or executing, if any."""
    return (Step.objects.filter(run_id=run_id, status__in=IN_FLIGHT_STEP_STATUSES)
            .order_by("-index").first())
