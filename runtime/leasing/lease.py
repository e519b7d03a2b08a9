"""Committing a lease holder's plans, creating runs, and appending an operator's events.

Every write here is one transaction holding a state change and its audit events. A lease
holder's commit is a compare-and-set on owner, epoch and chain head, executed by the engine's
committer; a database fault (a lock timeout, a dropped connection, a restarted server) is
ridden out: reconnect, back off, and find out from the chain head whether the commit landed
before trying it again, so a worker never gives a run up for a fault it could wait out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from runtime.errors import ApprovalConflict, AuthorizationWithdrawn, LeaseLost, one_line
from runtime.models import Run, RunStatus, Step
from runtime.storage.base import Committed, Refused
from runtime.storage.engines import engine, lease_expired, notify_ready
from runtime.storage.events import build_events, log_events
from runtime.storage.faults import DATABASE_FAULTS, pause_after_fault
from runtime.storage.guards import STANDING_WITHDRAWN
from runtime.storage.plan import Fence, Plan

log = logging.getLogger("runtime.store")


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


# How a lease holder's plan is committed: ``lease_commit``, or something that runs it elsewhere.
Committer = Callable[["Lease", Plan, Any], Committed]


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
    _fence(lease, plan)
    return lease_settle(lease, plan, clock, None)


def lease_commit_many(items: Sequence[tuple[Lease, Plan]], clock: Any, *,
                      ride_faults: bool = True) -> list[Committed | BaseException]:
    """Several holders' plans at once, as ``lease_commit`` commits each: together where the
    engine can (SQLite: one group commit, one sync), each fenced on its own. What became of
    each: its ``Committed``, or what ``lease_commit`` would have raised. With ``ride_faults``
    False a plan that met a database fault gets the fault, to be ridden out elsewhere by
    ``lease_settle`` (its backoff would hold up the caller)."""
    for lease, plan in items:
        _fence(lease, plan)
    # A plan that writes through the ORM is a transaction of its own: it is committed alone
    # below (as is every plan if the group cannot be prepared: nothing of it was written).
    together = [plan for _lease, plan in items if not plan.in_orm]
    results: dict[int, Committed | BaseException | None] = {}
    if len(together) > 1 and engine().groups_commits:
        found: list[Committed | BaseException | None]
        try:
            found = list(engine().commit_many(together, clock))
        except DATABASE_FAULTS as exc:  # some may have landed: each finds out from its chain
            found = [exc] * len(together)
        except Exception:
            log.exception("a group of %d plans could not be prepared; each is committed alone",
                          len(together))
            found = [None] * len(together)
        results = {id(plan): result for plan, result in zip(together, found, strict=True)}
    out: list[Committed | BaseException] = []
    for lease, plan in items:
        result = results.get(id(plan))
        if result is None and not ride_faults:  # alone: one attempt here, faults handed back
            try:
                result = engine().commit(plan, clock)
            except BaseException as exc:
                result = exc
        if not ride_faults and isinstance(result, DATABASE_FAULTS):
            out.append(result)
            continue
        try:
            out.append(lease_settle(lease, plan, clock, result))
        except BaseException as exc:  # this plan's outcome, not the batch's
            out.append(exc)
    return out


def _fence(lease: Lease, plan: Plan) -> None:
    """Before a holder's commit: its fence as the plan needs it, and a commit that gives the
    lease up announced (``Lease.on_ending``)."""
    f = plan.fence
    if f.unexpired != plan.gated:  # (Fence's own constructor: a quarter of replace()'s cost)
        plan.fence = Fence(f.seq, f.owner, f.epoch, f.status, plan.gated, f.expired)
    if plan.releases:
        lease.ending = True
        if lease.on_ending is not None:
            lease.on_ending()


def lease_settle(lease: Lease, plan: Plan, clock: Any,
                 result: Committed | BaseException | None) -> Committed:
    """The holder's commit brought to its end: ``result`` of an attempt already made (a fault
    is ridden out from its chain head), or None to make it now; the lease moved to what it
    wrote, or the refusal raised as what it means."""
    try:
        if isinstance(result, Committed):
            committed = result
        else:
            fault = result if isinstance(result, DATABASE_FAULTS) else None
            if result is not None and fault is None:
                raise result
            committed = commit_riding_faults(plan, clock, window=max(lease.seconds, 5.0),
                                             lease=lease, fault=fault)
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
                         lease: Lease | None = None,
                         fault: BaseException | None = None) -> Committed:
    """``engine().commit(plan)``, through database faults for up to ``window`` seconds
    (``fault``: an attempt already made met this one).

    After a fault the commit may or may not have landed (the reply can be lost after the
    server committed), so nothing is sent again until the run's chain head has said which: at
    the plan's head it landed; still at the fence's it did not, and is tried again; anywhere
    else the fence refuses it.
    """
    deadline = time.monotonic() + window
    delay = 0.05
    while True:
        if fault is not None:
            _wait_out(fault, plan, delay, deadline)
            fault = None
        else:
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


def _refusal(lease: Lease, plan: Plan, refused: Refused, clock: Any) -> Exception:
    """Why a lease holder's commit was refused: a lost lease, or an approval that moved."""
    lost = lease_diagnose(lease, clock, seq=plan.fence.seq)
    if lost is not None:
        return lost
    if refused.approval_id is not None:
        return ApprovalConflict(refused.approval_id, refused.reason)
    if refused.reason == STANDING_WITHDRAWN:
        return AuthorizationWithdrawn(lease.run_id, plan.last_step_index())
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
