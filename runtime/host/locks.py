"""Who holds a file lock on this host, and whether that process is stopped: read from the
kernel's table of locks (``/proc/locks``) and the process's ``/proc/PID/stat``.

What SQLite's writers wait for is a lock held by another process; when that process is frozen
(SIGSTOP, a debugger), a waiter can say which one it is instead of only "database is locked".
Linux only: elsewhere, or when ``/proc`` cannot be read, every answer is None. Read on slow paths
only (a wait already long), never per transaction.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LOCKS = Path("/proc/locks")
STOPPED_STATES = ("T", "t")  # stopped by a signal; stopped by a debugger


@dataclass(frozen=True)
class Holder:
    """A process holding a lock: its pid (0 when it is in a pid namespace this process cannot
    see), its scheduler state and CPU time so far (None when unknown)."""

    pid: int
    state: str = ""
    cpu_ticks: int | None = None

    @property
    def stopped(self) -> bool:
        return self.state in STOPPED_STATES

    def describe(self) -> str:
        """``pid 4242 (stopped)``, ``pid 4242 (state D)``, ``pid 4242 (this process)``."""
        if self.pid <= 0:
            return "a process of another pid namespace"
        if self.pid == os.getpid():
            return f"pid {self.pid} (this process)"
        if self.stopped:
            return f"pid {self.pid} (stopped)"
        return f"pid {self.pid} (state {self.state})" if self.state else f"pid {self.pid}"


@dataclass(frozen=True)
class _Lock:
    kind: str  # FLOCK, POSIX, OFDLCK, ...
    write: bool
    pid: int
    inode: int
    device: tuple[int, int]
    start: int
    end: int | None  # None: to the end of the file


def _table() -> Iterator[_Lock]:
    """The granted locks of the host (waiting requests, the ``->`` lines, left out)."""
    try:
        text = LOCKS.read_text()
    except OSError:
        return
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8 or fields[1] == "->":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            yield _Lock(fields[1], fields[3] == "WRITE", int(fields[4]), int(inode),
                        (int(major, 16), int(minor, 16)), int(fields[6]),
                        None if fields[7] == "EOF" else int(fields[7]))
        except ValueError:
            continue


def _holding(path: str, kind: str, offset: int = 0) -> Holder | None:
    """The process holding a write lock of ``kind`` on ``path`` that covers byte ``offset``.
    Matched by inode and device; by inode alone when the device differs (an overlay file
    system shows the lower file's device)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    device = (os.major(st.st_dev), os.minor(st.st_dev))
    found = [lock for lock in _table()
             if lock.kind == kind and lock.write and lock.inode == st.st_ino
             and lock.start <= offset and (lock.end is None or offset <= lock.end)]
    exact = [lock for lock in found if lock.device == device] or found
    return process(exact[0].pid) if exact else None


def flock_holder(path: str) -> Holder | None:
    """The process holding an exclusive ``flock`` on ``path``, if any."""
    return _holding(path, "FLOCK")


def write_lock_holder(path: str, offset: int) -> Holder | None:
    """The process holding a POSIX (``fcntl``) write lock on ``path`` over byte ``offset``."""
    return _holding(path, "POSIX", offset)


def process(pid: int) -> Holder:
    """``pid`` with its state and CPU time (user and system, in clock ticks) now."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return Holder(pid, fields[0], int(fields[11]) + int(fields[12]))
    except (OSError, ValueError, IndexError):
        return Holder(pid)
