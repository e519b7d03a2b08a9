"""The engine behind ``manage.py runworker``: claim runs, execute them on threads, keep their
leases alive, take over the runs of dead workers, and stop without leaving work in flight.

A worker never dies of a database error: a claim that meets a busy, restarted or unreachable
database logs one line, drops its connection, backs off with jitter and tries again; a run's
commit rides the fault out the same way (``runtime.leasing.lease``). Idle workers wake when a run
becomes ready: on PostgreSQL by ``LISTEN``, on SQLite by the file's ``data_version``.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence

from django.db import connection

from runtime.agents.agent import registry
from runtime.approvals.deadlines import approvals_near_deadline
from runtime.approvals.expiry import approvals_expire
from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.conf import setting
from runtime.errors import LeaseLost, ProtocolMismatch, one_line
from runtime.host.cpu import Pinned, cpu_pin
from runtime.host.pids import boot_id, hostname, owner_provably_dead
from runtime.leasing.claims import Acquired, acquired_crash_points, run_claim_many, run_release
from runtime.leasing.heartbeat import LeaseKeeper, make_owner
from runtime.leasing.lease import Lease
from runtime.loop.driver import Driver
from runtime.meters import LEASE_LOST_STOPS, TAKEOVERS
from runtime.models import Run, Worker
from runtime.notifications.channels import channels
from runtime.notifications.delivery import SEND_TIMEOUT, OutboxSender
from runtime.schedules.firing import schedules_fire_due
from runtime.storage.base import ReadyWatch, WorkerStorage
from runtime.storage.engines import engine
from runtime.storage.faults import DATABASE_FAULTS, pause_after_fault
from runtime.storage.protocol import protocol_check
from runtime.worker.eventloop import EventLoop, TaskSlot
from runtime.worker.registration import (
    worker_beat,
    worker_register,
    worker_unregister,
)
from runtime.worker.slots import Slot, Wakeup, settle_connection

log = logging.getLogger("runtime.worker")

HOUSEKEEPING_SECONDS = 0.5  # how often a worker fires due schedules and expires approvals
DEAD_OWNERS_SECONDS = 1.0  # how stale the list of this host's dead workers may be
CLAIM_BATCH = 32  # runs claimed in one transaction at most
CLAIM_LINGER = 0.02  # how long a free slot may wait for others before it is claimed for
COMMIT_THREADS = 8  # the event loop's committer threads at most (PostgreSQL's commits)
LOOP_KINDS = ("asyncio", "threads")


class WorkerProcess:
    """One worker process: ``concurrency`` runs in flight (tasks on one event loop, or a thread
    each), one lease owner id, one heartbeat."""

    def __init__(
        self,
        *,
        name: str = "worker",
        concurrency: int = 1,
        lease_seconds: float | None = None,
        poll_interval: float = 0.5,
        grace_seconds: float = 30.0,
        agents: Sequence[str] | None = None,
        burst: bool = False,
        clock: Clock = SYSTEM_CLOCK,
        cpu: str | int = "off",
        loop: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        # "asyncio": runs in flight are tasks on one event loop (``runtime.worker.eventloop``);
        # "threads": each runs on a slot thread of its own (``runtime.worker.slots``).
        self.loop_kind = loop or str(setting("WORKER_LOOP"))
        if self.loop_kind not in LOOP_KINDS:
            raise ValueError(f"loop must be one of {', '.join(LOOP_KINDS)}, not {loop!r}")
        self._loop: EventLoop | None = None
        self.name, self.concurrency, self.burst = name, concurrency, burst
        self.lease_seconds = float(lease_seconds or setting("LEASE_SECONDS"))
        self.poll_interval, self.grace_seconds = poll_interval, grace_seconds
        # The agents this process has: it claims and takes over runs of these only, so a run
        # of an agent its code lacks (a rolling deploy) waits for a worker that has it.
        self.agents = list(agents) if agents else sorted(registry.all())
        self.clock = clock
        self.cpu = cpu  # runworker --cpu: confine the process's threads to one CPU
        self.pinned: Pinned | None = None
        self.owner = make_owner(name)
        self.keeper = LeaseKeeper(self.lease_seconds, clock=clock, on_tick=self._beat)
        self.driver = Driver(self.owner, lease_seconds=self.lease_seconds, clock=clock,
                             keeper=self.keeper, owner_is_dead=self._owner_is_dead)
        self._stop = threading.Event()
        self._next_housekeeping = 0.0
        self._sender: OutboxSender | None = None
        self._wake = Wakeup()
        self._lock = threading.Lock()
        # Run id -> (set when the run is done here, its lease), for every run in flight.
        self._active: dict[int, tuple[threading.Event, Lease]] = {}
        self._slots: list[Slot | TaskSlot] = []
        self._free: list[Slot | TaskSlot] = []
        # Runs claimed while the run of the slot they will take was committing its end (its
        # lease ``ending``): the first slot to free takes the oldest.
        self._pending: deque[Acquired] = deque()
        self.finished = 0
        self.faults = 0  # database faults ridden out by the claiming loop
        self.claim_conflicts = 0  # claims another worker won first (never on PostgreSQL)
        self.refusal: ProtocolMismatch | None = None
        self._dead: list[str] = []
        self._dead_at = float("-inf")
        self._storage: WorkerStorage | None = None  # the engine's services (started by run)
        self._freed_at: float | None = None  # when a slot first freed since the last claim
        # The last claim round found fewer runs than it asked for: only news of a run made
        # ready (a commit elsewhere, a notification) is worth another look before the poll.
        self._ran_dry = True
        self.claim_batch = max(1, min(CLAIM_BATCH, concurrency // 8))

    # -- lifecycle ----------------------------------------------------------------------------

    def run(self) -> int:
        """Work until asked to stop (or, with ``burst``, until nothing is runnable). Exit code:
        0, or 3 when the database speaks another protocol (nothing is claimed)."""
        self.pinned = cpu_pin(self.cpu)  # before any thread of the worker's starts
        # The engine's services: SQLite's checkpointer; PostgreSQL's pool, which runs in
        # flight borrow from, beside the main thread, the heartbeat and the sender.
        self._storage = storage = engine().worker_storage(self._threads() + 3)
        storage.start()
        try:
            if not self._register():
                return 0  # asked to stop before the database ever answered
        except ProtocolMismatch as exc:
            log.error("worker %s: %s", self.owner, exc)
            self.refusal = exc
            return 3
        storage.watch.fileno()  # PostgreSQL: LISTEN now, before the first claim
        # What start-up built (Django, the app, the agents) lives as long as the process: kept
        # out of the collector's full passes, which otherwise stop every slot while they walk
        # it (p99 step at 64 in flight: about 185 -> 145 ms).
        gc.freeze()
        self.keeper.start()
        if channels():  # notifications to deliver: a thread of their own (they wait on I/O)
            self._sender = OutboxSender(self.clock)
            self._sender.start()
        if self.loop_kind == "asyncio":
            self._loop = EventLoop(self.name, self._execute,
                                   commit_threads=self._commit_threads(),
                                   blocking_threads=self._blocking_threads())
            self.driver.committer = self._loop.commit
            self._slots = list(self._loop.slots(self.concurrency))
        else:
            self._slots = [Slot(f"{self.name}-slot{n}", self._execute)
                           for n in range(self.concurrency)]
        self._free = list(self._slots)
        log.info("worker %s started: %s, concurrency %d, lease %.1fs, poll %.2fs, agents %s%s",
                 self.owner, "event loop" if self._loop else "threads", self.concurrency,
                 self.lease_seconds, self.poll_interval,
                 ", ".join(self.agents) or "none (it claims nothing)",
                 f", CPU {self.pinned.cpu}" if self.pinned else "")
        delay = 0.05
        try:
            while not self._stop.is_set():
                try:
                    storage.watch.mark()  # before the claim: a commit during it is news
                    self._housekeep()
                    claimed = self._fill_slots()
                except ProtocolMismatch as exc:
                    log.error("worker %s: %s", self.owner, exc)
                    self.refusal = exc
                    break
                except DATABASE_FAULTS as exc:
                    self.faults += 1
                    log.warning("worker %s: database fault while claiming, retrying in "
                                "%.2fs: %s", self.owner, delay, one_line(exc))
                    pause_after_fault(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                delay = 0.05
                if self.burst and not claimed and not self._running():
                    log.info("worker %s: nothing left to run (burst)", self.owner)
                    break
                self._idle(storage.watch)
        finally:
            self._shutdown()
        return 3 if self.refusal is not None else 0

    def _commit_threads(self) -> int:
        """The event loop's committer threads: one per run in flight up to ``COMMIT_THREADS``
        (on SQLite their commits join one group; on PostgreSQL each holds a connection)."""
        return min(self.concurrency, COMMIT_THREADS)

    def _blocking_threads(self) -> int:
        """The event loop's pool for blocking calls: one thread per run in flight at most
        (made as they block), fewer where ``RUNTIME_WORKER_BLOCKING_THREADS`` says."""
        cap = int(setting("WORKER_BLOCKING_THREADS"))
        return min(self.concurrency, cap) if cap else self.concurrency

    def _threads(self) -> int:
        """The threads that keep a database connection while runs are in flight (the event
        loop's pool for blocking calls gives back what a call took: one spare for it)."""
        if self.loop_kind == "asyncio":
            return 1 + self._commit_threads() + 1
        return self.concurrency

    def _idle(self, watch: ReadyWatch) -> None:
        """Wait until the next poll, or less: a run that became claimable (an approval, a new
        run, a release) wakes the worker while it has a free slot and its last claim round
        ran dry. The engine's watch says so: on PostgreSQL a notification on the worker's
        listening connection; on SQLite a commit by another connection, which
        ``data_version`` shows. Slots freed by finished runs are claimed for together: at
        once when ``claim_batch`` of them are free, else ``CLAIM_LINGER`` seconds after the
        first (a claim round costs about the same for one run as for thirty-two). A slot
        counts as free from the moment its run begins the commit that gives its lease up
        (``_claimable``)."""
        deadline = time.monotonic() + self.poll_interval
        while not self._stop.is_set():
            free = self._claimable()
            if free > 0 and self._freed_at is not None:
                if free >= self.claim_batch:
                    break
                deadline = min(deadline, self._freed_at + CLAIM_LINGER)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            fd = watch.fileno()
            woken, readable = self._wake.wait(left if fd is not None
                                              else min(watch.poll_seconds, left), fd)
            if watch.news(readable=readable, woken=woken, wanted=free > 0 and self._ran_dry):
                break
            if woken:
                self._wake.clear()  # a slot freed, or a stop: look again
        self._wake.clear()

    def request_stop(self) -> None:
        """Stop claiming; runs in flight finish their current call, then are released."""
        if not self._stop.is_set():
            log.info("worker %s stopping: no new claims", self.owner)
        self._stop.set()
        self._wake.set()

    def _shutdown(self) -> None:
        self._stop.set()
        deadline = time.monotonic() + self.grace_seconds
        with self._lock:
            pending = list(self._active.items())
        if pending:
            log.info("worker %s: waiting up to %.0fs for %d run(s) in flight", self.owner,
                     self.grace_seconds, len(pending))
        for _run_id, (done, _lease) in pending:
            done.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            stuck = [(run_id, lease) for run_id, (done, lease) in self._active.items()
                     if not done.is_set()]
        for run_id, lease in stuck:
            try:
                released = run_release(lease, clock=self.clock,
                                       reason="worker stopped after its grace period")
            except Exception as exc:  # a fault, or the run moving on: its lease will expire
                log.warning("run=%s could not be released (%s); its lease will expire", run_id,
                            one_line(exc))
                continue
            log.warning("run=%s owner=%s %s after the grace period", run_id, self.owner,
                        "released" if released else "already lost")
        for slot in self._slots:
            slot.stop()  # a slot stuck in a call it never returns from dies with the process
        if self._loop is not None:
            self._loop.stop()
        self.keeper.stop()
        if self._sender is not None:
            self._sender.stop()
            self._sender.join(timeout=SEND_TIMEOUT + 1)
        self._wake.close()
        summary = self._storage.stop() if self._storage is not None else ""
        worker_unregister(self.owner)
        log.info("worker %s stopped (%d runs handled, %d claim conflicts, %d database faults "
                 "ridden out)%s", self.owner, self.finished, self.claim_conflicts, self.faults,
                 summary)
        connection.close()
        if self.pinned is not None:
            self.pinned.release()

    # -- claiming -----------------------------------------------------------------------------

    def _housekeep(self) -> None:
        """Fire the schedules' due occurrences, expire approvals past their deadline, and warn
        of or escalate those near it (any worker may: each is a compare-and-set, so two
        workers doing it at once do it once). A
        database fault goes to the loop's back-off; anything else is logged, never fatal."""
        if time.monotonic() < self._next_housekeeping:
            return
        self._next_housekeeping = time.monotonic() + HOUSEKEEPING_SECONDS
        now = self.clock.now()
        try:
            fired = schedules_fire_due(now, agents=self.agents)
            expired = approvals_expire(now)
            warned, escalated = approvals_near_deadline(now)
        except DATABASE_FAULTS:
            raise
        except Exception:
            log.exception("worker %s: firing schedules or expiring approvals failed", self.owner)
            return
        if fired:
            log.info("worker %s: fired %d scheduled run(s): %s", self.owner, len(fired), fired)
        if expired:
            log.info("worker %s: %d approval(s) expired: %s", self.owner, len(expired), expired)
        if warned or escalated:
            log.info("worker %s: approval(s) near their deadline: warned %s, escalated %s",
                     self.owner, warned, escalated)

    def _running(self) -> int:
        with self._lock:
            return len(self._active)

    def _claimable(self) -> int:
        """How many runs may be claimed now: slots free, or whose run is committing its end
        (a pause, a release, its last step). A run claimed for such a slot waits in
        ``_pending`` for that commit, which the claim's own commit usually joins."""
        with self._lock:
            return self.concurrency - sum(1 for _done, lease in self._active.values()
                                          if not lease.ending)

    def _ending(self) -> None:
        """A run's lease-giving commit began (on the run's thread): claim for its slot now."""
        with self._lock:
            if self._freed_at is None:
                self._freed_at = time.monotonic()
        self._wake.set()

    def _fill_slots(self) -> int:
        """Claim runs for the free slots, up to ``CLAIM_BATCH`` in one transaction at a time."""
        claimed = 0
        with self._lock:
            self._freed_at = None
        while not self._stop.is_set():
            free = self._claimable()
            if free <= 0:
                break
            with self._lock:
                mine = list(self._active)
            asked = min(free, CLAIM_BATCH)
            got = run_claim_many(
                self.owner, asked, lease_seconds=self.lease_seconds,
                clock=self.clock, agents=self.agents, dead_owners=self._dead_owners(),
                exclude=mine, on_conflict=self._conflict)
            for acquired in got:
                acquired_crash_points(acquired)
                self._start(acquired)
            claimed += len(got)
            self._ran_dry = len(got) < asked
            if self._ran_dry:
                break
        return claimed

    def _conflict(self) -> None:
        self.claim_conflicts += 1

    def _dead_owners(self) -> list[str]:
        """Owners on this host whose process is provably gone; looked up at most once per
        ``DEAD_OWNERS_SECONDS`` (a claim per run would otherwise pay for it each time)."""
        now = time.monotonic()
        if now - self._dead_at >= DEAD_OWNERS_SECONDS:
            rows = Worker.objects.filter(host=hostname(), boot_id=boot_id()).exclude(
                owner=self.owner).values_list("owner", "proc_start")
            self._dead = [owner for owner, start in rows
                          if owner_provably_dead(owner, boot=boot_id(), proc_start=start)]
            self._dead_at = now
        return self._dead

    def _owner_is_dead(self, run: Run) -> bool:
        row = Worker.objects.filter(owner=run.lease_owner).values_list(
            "boot_id", "proc_start").first()
        return row is not None and owner_provably_dead(run.lease_owner, boot=row[0],
                                                       proc_start=row[1])

    # -- executing ----------------------------------------------------------------------------

    def _start(self, acquired: Acquired) -> None:
        run_id = acquired.run.pk
        acquired.lease.on_ending = self._ending
        self.keeper.add(acquired.lease)  # heartbeated from the claim, even while pending
        with self._lock:
            self._active[run_id] = (threading.Event(), acquired.lease)
            # No slot free: the claim counted one whose run is committing its end.
            slot = self._free.pop() if self._free else None
            if slot is None:
                self._pending.append(acquired)
        log.info("run=%s owner=%s %s", run_id, self.owner,
                 "taken over" if acquired.taken_over else "claimed")
        if acquired.taken_over:
            TAKEOVERS.inc()
        if slot is not None:
            slot.give(acquired)

    def _execute(self, slot: Slot | TaskSlot, acquired: Acquired) -> None:
        run_id = acquired.run.pk
        try:
            run = self.driver.execute(acquired, should_stop=self._stop.is_set, reload=False)
            log.info("run=%s owner=%s left %s", run_id, self.owner, run.status)
        except LeaseLost as exc:
            log.warning("run=%s owner=%s stopped: %s", run_id, self.owner, exc.reason)
            LEASE_LOST_STOPS.inc()
        except DATABASE_FAULTS as exc:
            # The database stayed away longer than a commit waits: the lease runs out and
            # whoever takes the run over applies the interruption contract to its step.
            log.warning("run=%s owner=%s stopped by a database fault; its lease will expire: "
                        "%s", run_id, self.owner, one_line(exc))
            connection.close()
        except Exception:
            # A bug or a database failure: leave the lease to expire, so the run is taken over
            # and the interruption contract decides what to do with its step. The slot's next
            # run starts on a new connection.
            log.exception("run=%s owner=%s crashed; its lease will expire", run_id, self.owner)
            connection.close()
        finally:
            settle_connection()
            following = None
            with self._lock:
                done, _lease = self._active.pop(run_id)
                self.finished += 1
                if self._pending:
                    following = self._pending.popleft()
                else:
                    self._free.append(slot)
                    if self._freed_at is None:
                        self._freed_at = time.monotonic()
            done.set()
            if following is not None:
                # The claim loop counted this slot free when its run began to end: no news.
                slot.give(following)
            else:
                self._wake.set()

    # -- the Worker row -----------------------------------------------------------------------

    def _register(self) -> bool:
        """This process's row (``runtime.worker.registration``); False if told to stop first."""
        return worker_register(owner=self.owner, name=self.name, concurrency=self.concurrency,
                               lease_seconds=self.lease_seconds, agents=self.agents,
                               clock=self.clock, stopping=self._stop.is_set)

    def _beat(self) -> None:
        """After the leases are renewed: the worker's row, and the protocol check (a database
        upgraded under a running worker stops its claims)."""
        worker_beat(self.owner, len(self.keeper.held()), self.clock)
        try:
            protocol_check(force=True)
        except ProtocolMismatch as exc:
            log.error("worker %s: %s", self.owner, exc)
            self.refusal = exc
            self.request_stop()  # runs in flight finish their call; nothing new is claimed

