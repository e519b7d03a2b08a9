"""Committing a lease holder's plans, creating runs, and appending an operator's events.

Every write here is one transaction holding a state change and its audit events. A lease
holder's commit is a compare-and-set on owner, epoch and chain head, executed by the engine's
committer; a database fault (a lock timeout, a dropped connection, a restarted server) is
ridden out: reconnect, back off, and find out from the chain head whether the commit landed
before trying it again, so a worker never gives a run up for a fault it could wait out.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import (
    DEFAULT_DB_ALIAS,
    InterfaceError,
    InternalError,
    OperationalError,
    connections,
    transaction,
)
from django.db.models import BooleanField, ExpressionWrapper, JSONField, Q, Value

from .anchors import run_creation_append_in_tx
from .audit import EventSpec, build_events, insert_events, log_events
from .canonical import check_payload
from .dbnet import pool_capacity, with_pool
from .engines import Committed, Refused, engine
from .errors import ApprovalConflict, LeaseLost
from .models import Run, RunStatus, Step
from .plan import Fence, Plan

log = logging.getLogger("runtime.store")

# What a worker rides out instead of giving up: the database was busy, went away, restarted,
# or (after a failover) is read-only for a while.
DATABASE_FAULTS = (OperationalError, InterfaceError, InternalError)


@dataclass(eq=False)
class Lease:
    """This process's hold on one run: owner and epoch fence every write it makes.

    ``position`` mirrors the run's audit chain head (sequence number, hash), so appends need no
    read first; it is one attribute, replaced whole, so another thread never sees half of it.
    """

    run_id: int
    owner: str
    epoch: int
    expires_at: datetime | None
    position: tuple[int, str]
    seconds: float = 30.0
    lost: bool = False  # set by the heartbeat when a renewal finds the lease gone
    ending: bool = False  # a commit giving the lease up is under way: not a loss
    # Called (on the run's thread) as that commit begins: a worker claims the run's successor
    # meanwhile, so the slot does not stand idle for a claim's commit once the run is done.
    on_ending: Callable[[], None] | None = None

    @property
    def seq(self) -> int:
        return self.position[0]


def lease_plan(lease: Lease, at: datetime) -> Plan:
    """An empty plan for the lease holder's next commit, chained after the position the lease
    has now (a commit by anyone else meanwhile makes its fence refuse)."""
    seq, head = lease.position
    return Plan(run_id=lease.run_id, at=at, actor=lease.owner, head=head,
                fence=Fence(seq=seq, owner=lease.owner, epoch=lease.epoch))


def lease_commit(lease: Lease, plan: Plan, clock: Any) -> Committed:
    """Commit ``plan`` only while ``lease`` still holds the run at the position the plan was
    made at (and, if an outside call follows, holds it unexpired at the fencing statement).
    Raises ``LeaseLost`` (nothing written) when the fence refuses."""
    f = plan.fence
    if f.unexpired != plan.gated:  # (Fence's own constructor: a quarter of replace()'s cost)
        plan.fence = Fence(f.seq, f.owner, f.epoch, f.status, plan.gated, f.expired)
    if plan.releases:
        lease.ending = True
        if lease.on_ending is not None:
            lease.on_ending()
    try:
        committed = commit_riding_faults(plan, clock, window=max(lease.seconds, 5.0),
                                         lease=lease)
    except Refused as refused:
        lease.ending = False
        raise _refusal(lease, plan, refused, clock) from None
    except BaseException:
        lease.ending = False
        raise
    lease.position = (committed.seq, committed.head)
    log_events(committed.rows)
    if plan.run.get("status") == RunStatus.QUEUED:
        notify_ready()
    return committed


def commit_riding_faults(plan: Plan, clock: Any, *, window: float,
                         lease: Lease | None = None) -> Committed:
    """``engine().commit(plan)``, through database faults for up to ``window`` seconds.

    After a fault the commit may or may not have landed (the reply can be lost after the
    server committed), so nothing is sent again until the run's chain head has said which: at
    the plan's head it landed; still at the fence's it did not, and is tried again; anywhere
    else the fence refuses it.
    """
    deadline = time.monotonic() + window
    delay = 0.05
    while True:
        try:
            return engine().commit(plan, clock)
        except DATABASE_FAULTS as exc:
            _wait_out(exc, plan, delay, deadline)
        while True:  # in doubt: ask until the database answers, never commit blind
            delay = min(delay * 2, 2.0)
            try:
                landed = _landed(plan, clock, lease)
                break
            except DATABASE_FAULTS as exc:
                _wait_out(exc, plan, delay, deadline)
        if landed is not None:
            return landed


def _wait_out(exc: BaseException, plan: Plan, delay: float, deadline: float) -> None:
    """Log the fault and back off, or re-raise it once the window is spent."""
    if time.monotonic() + delay > deadline:
        raise exc
    log.warning("run=%s database fault, retrying in %.2fs: %s", plan.run_id, delay,
                one_line(exc))
    pause_after_fault(delay)


def _landed(plan: Plan, clock: Any, lease: Lease | None) -> Committed | None:
    """The committed plan if the run's chain head shows it landed; None if it did not.

    A landed plan that starts an outside call counts only while the lease is still unexpired
    by the database's time: after a long outage it may have lapsed, and then nothing starts.
    """
    rows, seq, head = build_events(plan.run_id, plan.fence.seq, plan.head, plan.events,
                                   plan.actor, plan.at)
    found = Run.objects.filter(pk=plan.run_id).annotate(expired=lease_expired(clock)).values_list(
        "event_seq", "event_hash", "lease_expires_at", "expired").first()
    if found is not None and found[:2] == (seq, head):
        for step in plan.step_inserts:  # their ids were in the reply that was lost
            step.pk = Step.objects.filter(run_id=plan.run_id, index=step.index).values_list(
                "pk", flat=True).get()
            step._state.adding = False
        if lease is not None:
            lease.position = (seq, head)
        if plan.gated and found[3]:
            raise LeaseLost(plan.run_id, plan.actor, f"lease expired at {found[2]} while the "
                            "database was away", expired_but_held=True)
        return Committed(rows, seq, head, found[2] if plan.take else None)
    if found is None or found[:2] != (plan.fence.seq, plan.head):
        raise Refused("the run moved on")
    return None


def pause_after_fault(delay: float) -> None:
    """Drop this thread's connection (the next query opens a new one) and back off, with
    jitter so workers that lost the same server do not return in step."""
    close_connection()
    time.sleep(delay * random.uniform(0.5, 1.0))


# In a DATABASES entry: this process's threads lend each other its pool's connections.
LEND = "RUNTIME_LEND_CONNECTIONS"


def close_connection() -> None:
    try:
        connections[DEFAULT_DB_ALIAS].close()
    except Exception:  # a connection that is already broken may fail to close: it is gone
        log.debug("closing a failed connection failed", exc_info=True)


def connection_pool_start(threads: int) -> None:
    """From now on, take this process's PostgreSQL connections from a pool (``runtime.dbnet``:
    ``RUNTIME_PG_POOL_SIZE``), as a worker of ``threads`` threads does. If the pool has fewer
    connections than that, its runs lend them: each holds one only while it talks to the
    database (``connection_release``); if not, each thread keeps the one it took, and no step
    pays for a return and a checkout. Nothing on SQLite or where the settings chose otherwise.
    Other processes (the console, commands) keep Django's connection per request: a pooled
    connection that died with a restarted server would fail the request that drew it, where a
    worker rides the error out."""
    db = connections[DEFAULT_DB_ALIAS]
    pooled = with_pool(db.settings_dict)
    if pooled is not db.settings_dict:
        db.close()  # opened before the pool: closed, not lent
        db.settings_dict["OPTIONS"] = pooled["OPTIONS"]  # every thread's wrapper shares it
    capacity = pool_capacity(db.settings_dict)
    if capacity is not None:
        db.settings_dict[LEND] = threads > capacity


def connection_release() -> None:
    """Give this thread's connection back to the pool before a wait outside the database (an
    LLM, a tool, a backoff, an idle slot), where runs lend their connections
    (``connection_pool_start``), so a run in flight holds one only while it talks to the
    database. Nothing elsewhere (SQLite; no pool; a pool with a connection for every thread)
    or inside a transaction."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.settings_dict.get(LEND) and db.connection is not None and not db.in_atomic_block:
        db.close()


def one_line(exc: BaseException) -> str:
    """An error on one line of a log, at most 300 characters."""
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def notify_ready() -> None:
    """Tell idle workers a run became ready (after the commit that made it so)."""
    try:
        engine().notify_ready()
    except DATABASE_FAULTS as exc:  # a missed wake-up costs one poll interval, nothing more
        log.warning("could not notify workers: %s", one_line(exc))


def now_expression(clock: Any) -> Any:
    """The time a lease is judged by, as a query expression (the server's clock, or
    ``clock``'s value read now)."""
    return engine().now_expression(clock)


def lease_expired(clock: Any) -> ExpressionWrapper:
    """Whether a run's lease is gone (none, or past its expiry) by the database's time, as a
    query expression: claims, the landed check and the diagnosis all judge it this one way."""
    return ExpressionWrapper(
        Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now_expression(clock)),
        output_field=BooleanField())


def _refusal(lease: Lease, plan: Plan, refused: Refused, clock: Any) -> Exception:
    """Why a lease holder's commit was refused: a lost lease, or an approval that moved."""
    lost = lease_diagnose(lease, clock, seq=plan.fence.seq)
    if lost is not None:
        return lost
    if refused.approval_id is not None:
        return ApprovalConflict(refused.approval_id, refused.reason)
    return AssertionError(f"run {lease.run_id}: lease write refused, lease intact")


def lease_diagnose(lease: Lease, clock: Any, *, seq: int | None = None) -> LeaseLost | None:
    """Why a lease write made at chain position ``seq`` (by default the lease's) failed,
    marking the lease lost, or None if the lease is intact."""
    row = Run.objects.filter(pk=lease.run_id).annotate(expired=lease_expired(clock)).values(
        "lease_owner", "lease_epoch", "lease_expires_at", "event_seq", "expired").first()
    if row is None:
        err = LeaseLost(lease.run_id, lease.owner, "the run no longer exists")
    elif row["lease_owner"] != lease.owner or row["lease_epoch"] != lease.epoch:
        holder = row["lease_owner"] or "nobody"
        err = LeaseLost(lease.run_id, lease.owner,
                        f"lease lost: now held by {holder} (epoch {row['lease_epoch']})")
    elif row["event_seq"] != (lease.seq if seq is None else seq):
        if row["event_seq"] == lease.seq:  # this process's own loop moved it meanwhile
            return LeaseLost(lease.run_id, lease.owner, "the run moved on under this commit")
        err = LeaseLost(lease.run_id, lease.owner, "the run was changed by someone else")
    elif row["expired"]:
        err = LeaseLost(lease.run_id, lease.owner,
                        f"lease expired at {row['lease_expires_at']}", expired_but_held=True)
    else:
        return None
    lease.lost = True
    return err


def run_create(
    agent: str, input: Any, *, created_by: str = "", now: datetime, actor: str = ""
) -> Run:
    """Insert a queued run with its ``run.created`` event and its entry in the global audit
    chain. The caller checked the agent."""
    with transaction.atomic():
        run = run_create_in_tx(agent, input, created_by=created_by, now=now, actor=actor)
    log_events(run.created_rows)
    return run


def run_create_in_tx(agent: str, input: Any, *, created_by: str = "", now: datetime,
                     actor: str = "", origin: dict[str, Any] | None = None) -> Run:
    """``run_create`` inside the caller's transaction. ``origin`` names the schedule
    occurrence that creates the run (schedule, occurrence_at, skipped, authorized_at): kept on
    the run and in its ``run.created`` event."""
    data = check_payload("run input", input)
    extra: dict[str, Any] = {}
    payload: dict[str, Any] = {"agent": agent, "input": data, "created_by": created_by}
    if origin is not None:
        schedule = origin["schedule"]
        extra = {"schedule_id": schedule.pk, "occurrence_at": origin["occurrence_at"],
                 "authorized_at": origin["authorized_at"]}
        payload["schedule"] = {
            "id": schedule.pk, "name": schedule.name,
            "occurrence": origin["occurrence_at"].isoformat(timespec="microseconds"),
            "skipped": origin["skipped"],
            "authorized_at": None if origin["authorized_at"] is None
            else origin["authorized_at"].isoformat(timespec="microseconds"),
            "authorized_by": schedule.authorized_by if origin["authorized_at"] else ""}
    # JSON null is a valid input: stored as JSON, not as SQL NULL (which the column refuses).
    stored = Value(None, JSONField()) if data is None else data
    run = Run.objects.create(agent=agent, input=stored, status=RunStatus.QUEUED,
                             created_by=created_by, created_at=now, updated_at=now, **extra)
    run.input = data
    spec = EventSpec("run.created", payload)
    rows, seq, head = build_events(run.pk, 0, "", [spec], actor or created_by or "system", now)
    insert_events(rows)
    Run.objects.filter(pk=run.pk).update(event_seq=seq, event_hash=head)
    run_creation_append_in_tx(run.pk, agent, created_by, now, head)
    transaction.on_commit(notify_ready)
    run.event_seq, run.event_hash = seq, head
    run.created_rows = rows
    return run
