"""Group commit on SQLite: the commits of every run in flight in a process share one transaction.

SQLite has one writer and each commit pays a sync of its own, so a process with many runs in
flight spent its time queueing for the write lock, one commit at a time. Here the thread whose
plan arrives while no group is being written becomes the *leader*: it takes the write lock once,
applies its own plan and every plan queued behind it, each inside a savepoint with its own
fence, and commits (one sync) for them all. The group is taken once the lock is held, so the
plans queued while it waited for another process's commit ride along. Threads that arrive
later queue and wait; when the group is written, each learns its own outcome, and the first of
the next queue leads the next group. A plan alone in the process commits at once, with no
added delay.

One plan's refusal (its lease lost, its chain moved) or error undoes that plan only; the others
commit. A database fault, a failed ``COMMIT`` or a crash loses the whole group
(nothing of it is written) and every plan in it hears of it: their writers find out from the
chain head, as after any fault (``runtime.leasing.lease``). Nothing is released before the group's
``COMMIT`` returns, so no outside call starts on a commit that is not durable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.db import InterfaceError, InternalError, OperationalError

from runtime import crashpoints
from runtime.crashpoints import CrashPoint
from runtime.meters import GROUP_COMMIT_PLANS
from runtime.storage.base import Refused
from runtime.storage.plan import Plan

# Errors that end the transaction itself (SQLite may have rolled it back): fatal to the group.
GROUP_FAULTS = (OperationalError, InterfaceError, InternalError)


class Signal:
    """A one-shot wake-up for the one thread that waits on a ticket: a lock held until it is
    given. A commit waits on one, so ``threading.Event``'s condition (a lock allocated per
    wait, a queue of waiters) cost every commit more than the wake-up itself."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        """Wake the waiter (at most once per ticket: it is then done, or leads)."""
        self._lock.release()

    def wait(self) -> None:
        self._lock.acquire()


@dataclass
class Ticket:
    """One plan waiting for a group: what to apply, and (once written) what became of it."""

    plan: Plan
    apply: Callable[[GroupTx], Any]  # applies the plan in the group's transaction; its result
    value: Any = None
    error: BaseException | None = None
    done: bool = False
    lead: bool = False  # handed the next group instead of an outcome
    woken: Signal = field(default_factory=Signal)

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class GroupTx(Protocol):
    """A group's open write transaction, as the committer of an engine gives it."""

    deferring: bool  # set while a pass may leave writes (the events) to ``flush``

    def execute(self, sql: str) -> Any: ...

    def flush(self) -> None:
        """Write what the plans of this pass deferred (one statement for all)."""

    def discard(self) -> None:
        """Forget what was deferred (the pass is being undone)."""


@dataclass
class GroupStats:
    """This process's groups: how many were written and how many plans they carried."""

    groups: int = 0
    plans: int = 0
    largest: int = 0


class GroupCommitter:
    """The leader/follower queue of one database file in this process."""

    def __init__(self, limit: int = 512) -> None:
        self.limit = limit  # plans per group at most (a group's savepoints stay few)
        self._lock = threading.Lock()
        self._queue: list[Ticket] = []
        self._leading = False
        self.stats = GroupStats()

    def commit(self, ticket: Ticket, transaction: Callable[[], Any]) -> Any:
        """Write ``ticket``'s plan in a group (``transaction()`` opens the write transaction
        on the calling thread's connection); its result, or the error it met."""
        self.commit_all([ticket], transaction)
        return ticket.outcome()

    def commit_all(self, tickets: Sequence[Ticket], transaction: Callable[[], Any]) -> None:
        """Write every ticket's plan, in the group being formed (a worker's claims ride with
        its runs' commits); returns once each has its outcome."""
        with self._lock:
            lead = not self._leading
            if lead:
                self._leading = True
                self._queue[:0] = tickets[1:]  # in the group this thread leads
            else:
                self._queue.extend(tickets)
        if lead:
            self._lead(tickets[0], transaction)
        for t in tickets:
            if not t.done:
                t.woken.wait()
            if not t.done:  # handed the lead: the queue it heads is the next group
                self._lead(t, transaction)

    def _lead(self, ticket: Ticket, transaction: Callable[[], Any]) -> None:
        def take() -> list[Ticket]:
            with self._lock:
                if ticket.lead:  # handed over: the queue it heads is this group
                    batch, self._queue = self._queue[:self.limit], self._queue[self.limit:]
                else:
                    batch, self._queue = [ticket, *self._queue[:self.limit - 1]], \
                        self._queue[self.limit - 1:]
            return batch

        batch = write_group(take, transaction)
        GROUP_COMMIT_PLANS.observe(len(batch))
        for t in batch:
            t.done = True
            if t is not ticket:
                t.woken.set()
        with self._lock:
            self.stats.groups += 1
            self.stats.plans += len(batch)
            self.stats.largest = max(self.stats.largest, len(batch))
            if self._queue:
                successor = self._queue[0]
                successor.lead = True
                successor.woken.set()
            else:
                self._leading = False


def write_group(take: Callable[[], Sequence[Ticket]],
                transaction: Callable[[], Any]) -> Sequence[Ticket]:
    """Write a group in one transaction and commit: ``take()``, called once the write lock is
    held, says which plans (so every plan queued while the lock was awaited rides along, and
    the next group need not wait for the lock again). Each ticket gets its result or error;
    the batch is returned. Never raises: a failure of the whole transaction becomes every
    ticket's error (the batch is then taken as it stands).

    A plan refused by its fence wrote nothing (the fence is its first statement), so plans are
    first applied one after the other with no savepoint of their own, their events deferred to
    one statement for the whole group. Only if one fails in another way (its writes half done)
    is the pass undone and each plan applied again inside a savepoint of its own, writing its
    own events, so that one rolls back alone.
    """
    batch: Sequence[Ticket] | None = None
    try:
        with transaction() as tx:
            batch = take()
            if len(batch) > 1:
                tx.execute("SAVEPOINT grp")
                tx.deferring = True
                done = _apply_all(batch, tx) and _flushed(tx)
                tx.deferring = False
                if not done:
                    tx.discard()
                    tx.execute("ROLLBACK TO grp")
                    _apply_each(batch, tx)
                tx.execute("RELEASE grp")
            else:
                _apply_all(batch, tx, alone=True)
            if len(batch) > 1 and crashpoints.is_armed():  # what the crash loses, for tests
                crashpoints.reached(CrashPoint.IN_GROUP_COMMIT, detail={"plans": [
                    {"run_id": t.plan.run_id, "fence_seq": t.plan.fence.seq}
                    for t in batch if t.error is None]})
    except BaseException as exc:
        if batch is None:  # the transaction never began: the group as it stands fails
            batch = take()
        for t in batch:
            t.value, t.error = None, exc
    return batch


def _apply_all(batch: Sequence[Ticket], tx: GroupTx, alone: bool = False) -> bool:
    """Apply each plan; False (the pass to be undone) when one failed other than by refusal.
    A plan alone needs no undoing: its failure fails the transaction."""
    for t in batch:
        t.value, t.error = None, None
        try:
            t.value = t.apply(tx)
        except GROUP_FAULTS:
            raise
        except Refused as refused:
            t.error = refused
        except Exception:
            if alone:
                raise
            return False
    return True


def _flushed(tx: GroupTx) -> bool:
    try:
        tx.flush()
    except GROUP_FAULTS:
        raise
    except Exception:  # a deferred write no plan can be blamed for alone: undo the pass
        return False
    return True


def _apply_each(batch: Sequence[Ticket], tx: GroupTx) -> None:
    """Apply each plan inside a savepoint of its own: one that fails rolls back alone."""
    for t in batch:
        t.value, t.error = None, None
        tx.execute("SAVEPOINT plan")
        try:
            t.value = t.apply(tx)
        except GROUP_FAULTS:
            raise
        except Exception as exc:  # this plan only: refused, or an error of its own
            tx.execute("ROLLBACK TO plan")
            t.error = exc
        tx.execute("RELEASE plan")


_committers: dict[str, GroupCommitter] = {}
_committers_lock = threading.Lock()


def group_committer(path: str) -> GroupCommitter:
    """The process's committer for the database file ``path``."""
    with _committers_lock:
        found = _committers.get(path)
        if found is None:
            found = _committers[path] = GroupCommitter()
        return found


def group_stats() -> GroupStats:
    """This process's groups over every database file."""
    with _committers_lock:
        out = GroupStats()
        for c in _committers.values():
            out.groups += c.stats.groups
            out.plans += c.stats.plans
            out.largest = max(out.largest, c.stats.largest)
        return out
