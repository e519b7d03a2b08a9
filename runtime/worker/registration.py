"""A worker process's row in the ``Worker`` table (what the console's workers page shows):
inserted when the process starts, riding out database faults; its heartbeat; removed when it
stops."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

from runtime.clock import Clock
from runtime.errors import one_line
from runtime.host.pids import boot_id, hostname, own_process_start
from runtime.models import Worker
from runtime.storage.engines import engine
from runtime.storage.faults import DATABASE_FAULTS, pause_after_fault
from runtime.storage.protocol import protocol_check

log = logging.getLogger("runtime.worker")


def worker_register(*, owner: str, name: str, concurrency: int, lease_seconds: float,
                    agents: Sequence[str], clock: Clock, stopping: Callable[[], bool]) -> bool:
    """Check the database's protocol and insert the process's row, with the agents it claims
    runs of (the console says when no live worker has a queued run's agent), riding out
    database faults; False if ``stopping()`` turned true first. Raises ``ProtocolMismatch``."""
    delay = 0.05
    while not stopping():
        now = clock.now()
        try:
            protocol_check(force=True)
            Worker.objects.create(
                owner=owner, name=name, host=hostname(), pid=os.getpid(), boot_id=boot_id(),
                proc_start=own_process_start(), started_at=now, heartbeat_at=now,
                concurrency=concurrency, lease_seconds=lease_seconds, agents=list(agents))
            return True
        except DATABASE_FAULTS as exc:
            log.warning("worker %s: database fault while registering, retrying in %.2fs: %s",
                        owner, delay, one_line(exc))
            pause_after_fault(delay)
            delay = min(delay * 2, 5.0)
    return False


def worker_beat(owner: str, runs_held: int, clock: Clock) -> None:
    """The row's heartbeat and the number of leases the process holds."""
    with engine().one_write():  # SQLite: queued like every writer, never busy-waiting
        Worker.objects.filter(owner=owner).update(heartbeat_at=clock.now(),
                                                  runs_held=runs_held)


def worker_unregister(owner: str) -> None:
    """Remove the row; after a fault it stays, and the console shows its age."""
    try:
        Worker.objects.filter(owner=owner).delete()
    except DATABASE_FAULTS as exc:
        log.warning("worker %s: could not remove its row: %s", owner, one_line(exc))
