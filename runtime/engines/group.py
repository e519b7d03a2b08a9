"""Group commit on SQLite: the commits of every run in flight in a process share one transaction.

SQLite has one writer and each commit pays a sync of its own, so a process with many runs in
flight spent its time queueing for the write lock, one commit at a time. Here the thread whose
plan arrives while no group is being written becomes the *leader*: it takes the write lock once,
applies its own plan and every plan queued behind it, each inside a savepoint with its own
fence, and commits (one sync) for them all. Threads that arrive meanwhile queue and wait; when
the group is written, each learns its own outcome, and the first of the next queue leads the
next group. A plan alone in the process commits at once, with no added delay.

One plan's refusal (its lease lost, its chain moved) or error rolls back its savepoint only;
the others commit. A database fault, a failed ``COMMIT`` or a crash loses the whole group
(nothing of it is written) and every plan in it hears of it: their writers find out from the
chain head, as after any fault (``runtime.store``). Nothing is released before the group's
``COMMIT`` returns, so no outside call starts on a commit that is not durable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import InterfaceError, InternalError, OperationalError

from .. import crashpoints
from ..crashpoints import CrashPoint
from ..plan import Plan

# Errors that end the transaction itself (SQLite may have rolled it back): fatal to the group.
GROUP_FAULTS = (OperationalError, InterfaceError, InternalError)


@dataclass
class Ticket:
    """One plan waiting for a group: what to apply, and (once written) what became of it."""

    plan: Plan
    apply: Callable[[], Any]  # applies the plan in the open transaction; its result
    value: Any = None
    error: BaseException | None = None
    done: bool = False
    lead: bool = False  # handed the next group instead of an outcome
    woken: threading.Event = field(default_factory=threading.Event)

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


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
        with self._lock:
            lead = not self._leading
            if lead:
                self._leading = True
            else:
                self._queue.append(ticket)
        if not lead:
            ticket.woken.wait()
            if ticket.done:
                return ticket.outcome()
        self._lead(ticket, transaction)
        return ticket.outcome()

    def _lead(self, ticket: Ticket, transaction: Callable[[], Any]) -> None:
        with self._lock:
            if ticket.lead:  # handed over: the queue it heads is this group
                batch, self._queue = self._queue[:self.limit], self._queue[self.limit:]
            else:
                batch, self._queue = [ticket, *self._queue[:self.limit - 1]], \
                    self._queue[self.limit - 1:]
        try:
            write_group(batch, transaction)
        finally:
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


def write_group(batch: Sequence[Ticket], transaction: Callable[[], Any]) -> None:
    """Apply every ticket's plan in one transaction (a savepoint each when there are several)
    and commit; each ticket gets its result or error. Never raises: a failure of the whole
    transaction becomes every ticket's error."""
    try:
        with transaction() as execute:
            if len(batch) == 1:
                batch[0].value = batch[0].apply()
                return
            for t in batch:
                execute("SAVEPOINT plan")
                try:
                    t.value = t.apply()
                except GROUP_FAULTS:
                    raise
                except Exception as exc:  # this plan only: refused, or an error of its own
                    execute("ROLLBACK TO plan")
                    t.error = exc
                execute("RELEASE plan")
            if crashpoints.is_armed():  # which plans the crash loses, for the test's check
                crashpoints.reached(CrashPoint.IN_GROUP_COMMIT, detail={"plans": [
                    {"run_id": t.plan.run_id, "fence_seq": t.plan.fence.seq}
                    for t in batch if t.error is None]})
    except BaseException as exc:
        for t in batch:
            t.value, t.error = None, exc


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
