"""A process that stops moving while it holds what SQLite's writers wait for.

Frozen (SIGSTOP, a debugger, a paused container) while it holds the writer queue's ``flock``,
it would stall every writer of the host for as long as it stays frozen. So a writer that has
waited for the queue longer than the patience (a quarter of ``RUNTIME_LEASE_SECONDS``, and at
most half the connection's busy timeout) passes the holder: it logs one line naming it and goes
on to SQLite's own lock (``BEGIN IMMEDIATE`` and its busy timeout), which alone decides who
writes. Every writer of the process then passes it at once while that process holds the queue
without moving (its CPU time unchanged); once it lets go or moves, writers queue again.

Frozen inside a write transaction, it also holds SQLite's write lock, and nobody can write until
it continues or dies: "database is locked" then says which process holds that lock and that it
is stopped (``locked_message``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from runtime.conf import setting
from runtime.host.locks import Holder, flock_holder, write_lock_holder

log = logging.getLogger("runtime.store")

PATIENCE_OF_LEASE = 0.25  # the part of a lease a writer waits for a holder that does not let go
WAL_WRITE_LOCK = 120  # the byte of ``<database>-shm`` a WAL writer locks (SQLite's wal.c)
RESERVED_BYTE = 0x40000001  # the byte of the database a rollback-journal writer locks (os_unix.c)


def patience(timeout: float) -> float:
    """How long a writer waits for the queue's holder before it passes it: well within a lease,
    so a frozen holder delays no lease's renewal or takeover past it, and within the busy
    timeout the writer would otherwise give up at."""
    return min(float(setting("LEASE_SECONDS")) * PATIENCE_OF_LEASE, timeout / 2)


@dataclass(frozen=True)
class _Passed:
    holder: Holder | None  # None: /proc could not say who
    at: float  # time.monotonic() of the pass
    patience: float


_passed: dict[str, _Passed] = {}  # lock file -> the holder this process passes


def passing(lock_path: str) -> bool:
    """Whether this process still passes the queue's holder: the process it passed holds it
    and has not moved since (or, when /proc could not say who, for one patience after the
    pass). Otherwise forgets the pass: writers queue again. Asked only when the queue is
    taken, by a thread holding the process's lock for the file."""
    passed = _passed.get(lock_path)
    if passed is None:
        return False
    if passed.holder is None:
        if time.monotonic() - passed.at < passed.patience:
            return True
    elif flock_holder(lock_path) == passed.holder:
        return True
    del _passed[lock_path]
    log.info("writer queue %s: %s let go or moved; writers queue again", lock_path,
             passed.holder.describe() if passed.holder else "its holder")
    return False


def pass_holder(lock_path: str, waited: float, wait: float) -> None:
    """Pass the queue's holder after ``waited`` seconds, saying so in one line."""
    holder = flock_holder(lock_path)
    _passed[lock_path] = _Passed(holder, time.monotonic(), wait)
    who = holder.describe() if holder else "its holder (pid unknown)"
    log.warning("writer queue %s: %s has held it %.1f s without letting go; passed: this "
                "process writes through SQLite's own lock until it lets go or moves", lock_path,
                who, waited)


def sqlite_writer(database: str) -> Holder | None:
    """The process holding SQLite's write lock on ``database``: in WAL mode a lock on a byte
    of ``-shm``, in rollback-journal mode the RESERVED byte of the file itself."""
    return (write_lock_holder(f"{database}-shm", WAL_WRITE_LOCK)
            or write_lock_holder(database, RESERVED_BYTE))


def locked_message(database: str, waited: float) -> str | None:
    """For "database is locked" after ``waited`` seconds: which process holds SQLite's write
    lock and, if it is stopped, that nobody can write until it continues or dies. None when
    /proc cannot say."""
    holder = sqlite_writer(database)
    if holder is None:
        return None
    if holder.stopped:
        return (f"database is locked: pid {holder.pid} holds SQLite's write lock and has not "
                f"moved for {waited:.1f} s (stopped): nobody can write until it continues or "
                f"dies")
    return f"database is locked: {holder.describe()} has held SQLite's write lock {waited:.1f} s"


def queue_holder(lock_path: str) -> str:
    """Who holds the writer queue, for a timeout's message ("" when /proc cannot say)."""
    holder = flock_holder(lock_path)
    return f"; {holder.describe()} holds it" if holder else ""
