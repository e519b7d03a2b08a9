"""The event-loop worker's runs in flight: tasks on one asyncio loop, not a thread each.

Each claimed run is a task on the loop's thread; the run's code (design §5, the same code a
thread worker and ``runtime.resume`` run) executes in a greenlet of its task and hands every
wait to the loop (``runtime.agents.aio``): a commit goes to the committer threads (on SQLite
they join one group commit; on PostgreSQL each has a pooled connection), a blocking tool or
model client to a bounded pool, an ``async def`` tool or model is awaited on the loop itself,
a backoff is an ``asyncio.sleep``. Meanwhile the loop runs the other runs' code.

The heartbeat, the claims, the outbox sender and the checkpointer keep their own threads, so a
tool that blocks the loop (a sync call inside an ``async def``) holds up only the runs on this
loop: their leases are renewed on time, and nothing is taken over from a live worker.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from asyncio import events
from collections.abc import Callable
from functools import partial
from typing import Any, cast

from django.db import connection

from runtime.agents.aio import call_in, run_greenlet, run_in_greenlet, wait_for
from runtime.leasing.claims import Acquired
from runtime.leasing.lease import Lease, lease_commit, lease_commit_many, lease_settle
from runtime.storage.base import Committed
from runtime.storage.connections import close_connection, connection_give_back, connection_release
from runtime.storage.engines import engine
from runtime.storage.faults import DATABASE_FAULTS
from runtime.storage.plan import Plan
from runtime.worker.threads import DaemonPool

log = logging.getLogger("runtime.worker")

STOP_SECONDS = 5.0  # how long a stop waits for the loop's thread once no run is in flight


class EventLoop:
    """One worker's loop thread, its committer threads and its pool for blocking calls."""

    def __init__(self, name: str, execute: Callable[[Any, Acquired], None], *,
                 commit_threads: int, blocking_threads: int) -> None:
        """``execute(slot, acquired)`` runs one claimed run (in a greenlet of its task) and
        hands the slot back when done (the worker's ``_execute``)."""
        self.execute = execute
        self.loop = asyncio.new_event_loop()
        # SQLite: the plans of one turn of the loop are committed together (``_flush``).
        self.groups = engine().groups_commits
        self._batch: list[tuple[Lease, Plan, Any, asyncio.Future[Any]]] = []
        # Where the worker's threads lend each other connections (more threads than its pool
        # has), a committer gives its own back after each commit; a blocking call's thread
        # gives back whatever the call took from a pool.
        self.commits = DaemonPool(commit_threads, f"{name}-commit", after=connection_release)
        self.blocking = DaemonPool(blocking_threads, f"{name}-blocking",
                                   after=connection_give_back)
        self._tasks: set[asyncio.Task[None]] = set()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True, name=f"{name}-loop")
        self.thread.start()
        self._ready.wait()

    def slots(self, concurrency: int) -> list[TaskSlot]:
        return [TaskSlot(self) for _ in range(concurrency)]

    def commit(self, lease: Lease, plan: Plan, clock: Any) -> Committed:
        """A run's commit (``Execution.committer``). From its greenlet: on SQLite, with every
        other plan made in the same turn of the loop, in one group on the loop's thread (one
        sync, no thread woken); on PostgreSQL, on a committer thread while the loop goes on.
        From any other thread (a sync tool's ``ctx.dispatch()`` on the pool), right there."""
        if not self.groups or plan.in_orm or run_greenlet() is None:
            # (A plan that writes through the ORM is a transaction of its own on any engine.)
            return call_in(self.commits, lease_commit, lease, plan, clock)
        future = self.loop.create_future()
        if not self._batch:
            self.loop.call_soon(self._flush)  # after the runs woken in this turn got here
        self._batch.append((lease, plan, clock, future))
        return cast(Committed, wait_for(future))

    def _flush(self) -> None:
        """Commit the turn's plans together (the loop hidden, so the ORM works as on any
        thread); a plan that met a database fault rides it out on a committer thread, where
        its backoff holds up nobody else."""
        batch, self._batch = self._batch, []
        by_clock: dict[int, list[tuple[Lease, Plan, Any, asyncio.Future[Any]]]] = {}
        for item in batch:
            by_clock.setdefault(id(item[2]), []).append(item)
        for items in by_clock.values():
            events._set_running_loop(None)
            try:
                results = lease_commit_many([(lease, plan) for lease, plan, _c, _f in items],
                                            items[0][2], ride_faults=False)
            except BaseException as exc:  # a simulated crash: every plan of the group hears it
                results = [exc] * len(items)
            try:
                if any(isinstance(r, DATABASE_FAULTS) for r in results):
                    close_connection()  # the loop's, which met the fault: reads reconnect
            finally:
                events._set_running_loop(self.loop)
            for (lease, plan, clock, future), result in zip(items, results, strict=True):
                if isinstance(result, DATABASE_FAULTS):
                    settled = asyncio.wrap_future(self.commits.submit(
                        lease_settle, lease, plan, clock, result), loop=self.loop)
                    settled.add_done_callback(partial(_copy_outcome, future))
                else:
                    _resolve(future, result)

    def give(self, slot: TaskSlot, acquired: Acquired) -> None:
        self.loop.call_soon_threadsafe(self._begin, slot, acquired)

    def stop(self) -> None:
        """After the worker's last run: end the loop and the pools (a call stuck in the pool
        dies with the process)."""
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(STOP_SECONDS)
        if not self.thread.is_alive():
            self.loop.close()  # its selector and self-pipe
        self.blocking.shutdown(wait=False, cancel_futures=True)
        self.commits.shutdown(wait=False)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            try:
                connection.close()  # the runs' reads shared this thread's connection
            except Exception:
                log.exception("closing the loop's connection failed")

    def _begin(self, slot: TaskSlot, acquired: Acquired) -> None:
        task = self.loop.create_task(self._run(slot, acquired), name=f"run-{acquired.run.pk}")
        self._tasks.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._tasks.discard)

    async def _run(self, slot: TaskSlot, acquired: Acquired) -> None:
        try:
            await run_in_greenlet(self.execute, slot, acquired, blocking=self.blocking)
        except BaseException:  # what ended a run's task (execute has returned the slot)
            log.exception("run=%s: stopped by a BaseException", acquired.run.pk)


def _resolve(future: asyncio.Future[Any], outcome: Any) -> None:
    """Hand a run its commit's outcome (unless its task was cancelled meanwhile)."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _copy_outcome(future: asyncio.Future[Any], done: asyncio.Future[Any]) -> None:
    if done.cancelled():
        if not future.done():
            future.cancel()
    else:
        _resolve(future, done.exception() or done.result())


class TaskSlot:
    """A place for one run in flight on the loop: what a worker hands a claimed run to."""

    def __init__(self, loop: EventLoop) -> None:
        self._loop = loop

    def give(self, acquired: Acquired) -> None:
        self._loop.give(self, acquired)

    def stop(self) -> None:
        """Nothing to end: the loop is stopped once, after the last run."""
