"""SQLite with writers queued on a lock file instead of SQLite's busy handler.

SQLite lets one writer in at a time; a connection that finds the write lock taken sleeps in its
busy handler for 1, 2, 5, 10, ... ms before trying again, so two busy processes spend much of
their time asleep while the lock is free. Here every write transaction first takes an exclusive
``flock`` on ``<database>.writer`` (one open file per connection; threads of one process queue
first on a lock of their own): a waiting writer blocks in the kernel and goes the moment the
holder commits or rolls back. After the connection's
``timeout`` (``OPTIONS["timeout"]``, SQLite's own busy timeout) it gives up with "database is
locked", as SQLite would. SQLite's locking still decides who writes; the flock only orders the
queue, so a holder that does not let go within the patience (a process frozen while it holds
it) is passed: the waiter goes on to SQLite's own lock without it (``stalls``). The kernel
drops the flock when its holder's process dies, unless a child forked without exec still holds
a copy of the descriptor. Writes outside a transaction (autocommit) do not
queue; SQLite's busy timeout covers them. ``OPTIONS["writer_queue"] = False`` turns the queue
off (SQLite's busy handler alone, as in Django's backend) and keeps the rest.

Before SQLite opens a database file the backend refuses one on a network file system (NFS,
SMB/CIFS, sshfs, ...: design §12) and creates what is missing privately, whatever the umask:
the database's directory 0700, the database and the lock file 0600; SQLite gives ``-wal`` and
``-shm`` the database's mode. Existing files keep theirs (``manage.py check`` warns about loose
ones). See runtime/files.py.

The process keeps count of its write transactions, the time they waited for the lock and the
time they held it (``writer_stats``), so a worker can say how much of the single writer it used.
"""

from __future__ import annotations

import fcntl
import os
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from django.db import OperationalError, transaction
from django.db.backends.sqlite3.base import DatabaseWrapper as SQLiteWrapper

from runtime.host import files
from runtime.storage.sqlite import stalls


@dataclass
class WriterStats:
    """This process's write transactions since it started: how many, waiting, holding."""

    transactions: int = 0
    waited: float = 0.0  # seconds spent queued for the lock
    held: float = 0.0  # seconds between taking the lock and the end of the commit or rollback
    since: float = 0.0  # time.monotonic() when counting began
    passed: int = 0  # transactions that went to SQLite's lock past a queue holder not moving


_stats = WriterStats(since=time.monotonic())
_stats_lock = threading.Lock()


def writer_stats() -> WriterStats:
    """A copy of this process's counts."""
    with _stats_lock:
        return WriterStats(_stats.transactions, _stats.waited, _stats.held, _stats.since,
                           _stats.passed)


_absolute: dict[str, str] = {}


def absolute(name: str) -> str:
    """``os.path.abspath(name)``, remembered: every write transaction asks for its file's
    lock file, and a worker's commits for their file's group (the process never changes its
    directory)."""
    found = _absolute.get(name)
    if found is None:
        found = _absolute[name] = os.path.abspath(name)
    return found


_process_locks: dict[str, threading.Lock] = {}


def _process_lock(path: str) -> threading.Lock:
    """One lock per database in this process: its threads wait on it, not on the flock."""
    with _stats_lock:
        return _process_locks.setdefault(path, threading.Lock())


@dataclass
class _FlockRequest:
    """A blocking flock for the waiter thread to take on ``fd`` (a duplicate it closes)."""

    fd: int
    got: threading.Event = field(default_factory=threading.Event)
    failed: list[OSError] = field(default_factory=list)


def _waiter_loop(requests: queue.SimpleQueue[_FlockRequest]) -> None:
    while True:
        request = requests.get()
        try:
            fcntl.flock(request.fd, fcntl.LOCK_EX)
        except OSError as exc:
            request.failed.append(exc)
        finally:
            request.got.set()
            os.close(request.fd)


_waiters: dict[str, tuple[int, queue.SimpleQueue[_FlockRequest]]] = {}


def _waiter(path: str) -> queue.SimpleQueue[_FlockRequest]:
    """The requests of this process's one waiter thread for ``path`` (one thread for every
    contended wait, not a thread each: threads of a process queue on its lock first, so one
    of them at most waits here; a forked child starts a waiter of its own)."""
    with _stats_lock:
        found = _waiters.get(path)
        if found is None or found[0] != os.getpid():
            requests: queue.SimpleQueue[_FlockRequest] = queue.SimpleQueue()
            threading.Thread(target=_waiter_loop, args=(requests,), daemon=True,
                             name="sqlite-writer-queue").start()
            found = _waiters[path] = (os.getpid(), requests)
        return found[1]


_autocheckpoint: int | None = None  # new connections' wal_autocheckpoint (None: SQLite's)


def set_autocheckpoint(pages: int | None) -> None:
    """``PRAGMA wal_autocheckpoint`` for connections this process opens from now on; 0 when a
    checkpointer thread of the process's own does it (``runtime.storage.sqlite.checkpointer``),
    None for SQLite's default (a commit checkpoints the WAL past 1,000 pages, holding the
    writer)."""
    global _autocheckpoint
    _autocheckpoint = pages


_local_files: set[str] = set()  # databases found on a local file system, by this process


def prepare_database_file(name: Any) -> None:
    """Refuse a database on a network file system; create its missing directories (0700) and the
    file itself (0600) before SQLite does (SQLite would use the umask's mode)."""
    path = files.database_path(name)
    if path is None:
        return
    path = Path(os.path.abspath(path))
    real = os.path.realpath(path)
    if real not in _local_files:  # read the mounts once per database and process
        files.refuse_network_filesystem(path)
        with _stats_lock:
            _local_files.add(real)
    if files.is_read_only_uri(name):
        return
    try:
        files.private_dir(path.parent)
        files.private_file(path)
    except OSError as exc:  # a database error like SQLite's own "unable to open database file"
        raise OperationalError(f"unable to create the database file {path}: {exc}") from exc


class DatabaseWrapper(SQLiteWrapper):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._writer_fd: int | None = None
        self._writer_since: float | None = None  # when this connection took the lock
        self._writer_local: threading.Lock | None = None  # this process's lock, held with it

    def get_connection_params(self) -> dict[str, Any]:
        params = super().get_connection_params()
        params.pop("writer_queue", None)  # ours (see _writer_lock), not sqlite3.connect()'s
        return params

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        prepare_database_file(conn_params["database"])
        conn = super().get_new_connection(conn_params)
        if _autocheckpoint is not None:
            conn.execute(f"PRAGMA wal_autocheckpoint = {int(_autocheckpoint)}")
        return conn

    def _writer_lock(self) -> None:
        """Take this process's lock for the file (threads queue on it cheaply), then the
        flock that queues processes; both or neither, within the connection's timeout."""
        if self.is_in_memory_db() or not self.settings_dict["OPTIONS"].get("writer_queue", True):
            return
        path = absolute(f"{self.settings_dict['NAME']}.writer")
        if self._writer_fd is None:
            self._writer_fd = files.open_private(path)  # 0600 whatever the umask
        timeout = float(self.settings_dict["OPTIONS"].get("timeout", 5))
        local = _process_lock(path)
        asked = time.perf_counter()
        if not local.acquire(timeout=timeout):
            raise OperationalError(
                f"database is locked (waited {timeout:.1f} s for this process's writers)")
        try:
            try:
                fcntl.flock(self._writer_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._writer_queue(path, asked, timeout)
        except BaseException:
            local.release()
            raise
        self._writer_local = local
        self._writer_since = now = time.perf_counter()
        with _stats_lock:
            _stats.waited += now - asked

    def _writer_queue(self, path: str, asked: float, timeout: float) -> None:
        """Another process holds the flock: wait for it, or pass its holder. One that has not
        let go within the patience (frozen: SIGSTOP, a debugger) is passed, and this
        connection goes on to SQLite's own lock (BEGIN IMMEDIATE, its busy timeout) without
        the flock; so does every writer of this process while that holder holds the queue
        without moving (``stalls``)."""
        if stalls.passing(path):
            with _stats_lock:
                _stats.passed += 1
            return
        left = max(0.0, asked + timeout - time.perf_counter())
        wait = min(left, stalls.patience(timeout))
        if self._writer_wait(path, wait):
            return
        if wait >= left:  # the timeout ran out first (this process's writers took most of it)
            raise OperationalError(f"database is locked (waited {left:.1f} s in the writer "
                                   f"queue{stalls.queue_holder(path)})")
        stalls.pass_holder(path, time.perf_counter() - asked, wait)
        self._writer_fd = files.open_private(path)  # unlocking it is a no-op: nothing held
        with _stats_lock:
            _stats.passed += 1

    def _writer_wait(self, path: str, timeout: float) -> bool:
        """Queue for the lock in the kernel for at most ``timeout`` seconds; True once held.

        The process's waiter thread for this file makes the blocking call on a duplicate of
        the descriptor (a flock belongs to the open file, which both share) and closes the
        duplicate once it returns: the lock then stays with ``self._writer_fd``. Past the
        timeout this thread closes its own descriptor and gives up (False), so the lock,
        whenever the waiter gets it, goes with the waiter's duplicate, the file's last
        descriptor, and is let go at once.
        """
        fd = self._writer_fd
        assert fd is not None, "_writer_lock opened it before waiting"
        request = _FlockRequest(os.dup(fd))
        _waiter(path).put(request)
        if not request.got.wait(timeout):
            os.close(fd)
            self._writer_fd = None
            return False
        if request.failed:
            raise OperationalError(f"the writer queue's lock failed: {request.failed[0]}")
        return True

    def _writer_unlock(self) -> None:
        if self._writer_since is None:
            return
        held, self._writer_since = time.perf_counter() - self._writer_since, None
        # _writer_lock set both before _writer_since, and only _close() clears the descriptor.
        try:
            fcntl.flock(cast(int, self._writer_fd), fcntl.LOCK_UN)
        finally:
            cast(threading.Lock, self._writer_local).release()
        with _stats_lock:
            _stats.transactions += 1
            _stats.held += held

    @contextmanager
    def writer_queue_held(self) -> Iterator[None]:
        """Hold the writer queue's lock without a transaction: no writer of the runtime's
        starts meanwhile (the checkpointer's moment to let the WAL start over)."""
        if self.in_atomic_block:
            raise transaction.TransactionManagementError(
                "writer_queue_held() cannot run inside an atomic block")
        self.ensure_connection()
        self._writer_lock()
        try:
            yield
        finally:
            self._writer_unlock()

    @contextmanager
    def write_transaction(self) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on any exception), queued like
        every write transaction, without ``atomic()``'s bookkeeping around it: the runtime's
        loop commits twice a step and that bookkeeping cost a tenth of a step's CPU.

        Outside atomic blocks only. What runs inside may use the ORM's queries, inserts and
        updates (they join this transaction) but not ``atomic()`` or ``on_commit()``.
        """
        if self.in_atomic_block:
            raise transaction.TransactionManagementError(
                "write_transaction() cannot run inside an atomic block")
        self.ensure_connection()
        self._writer_lock()
        try:
            with self.wrap_database_errors:
                self.connection.execute("BEGIN IMMEDIATE")
        except OperationalError as exc:
            raise self._locked(exc) from exc
        except BaseException:
            self._writer_unlock()
            raise
        try:
            yield
        except BaseException:
            self._end_failed()
            raise
        try:
            self._commit()
        except BaseException:
            self._end_failed()  # a failed COMMIT leaves the transaction open: end it
            raise

    def _end_failed(self) -> None:
        """Roll back; if even that fails, close the connection (SQLite then rolls back)."""
        try:
            self._rollback()
        except BaseException:
            self.close()

    def _locked(self, exc: OperationalError) -> OperationalError:
        """End the queue's hold after BEGIN failed; "database is locked" names the process
        holding SQLite's write lock, when /proc can tell (the BEGIN waited since the queue)."""
        waited = time.perf_counter() - (self._writer_since or time.perf_counter())
        self._writer_unlock()
        if "database is locked" not in str(exc) or self.is_in_memory_db():
            return exc
        found = stalls.locked_message(absolute(str(self.settings_dict["NAME"])), waited)
        return OperationalError(found) if found else exc

    # Django's private transaction hooks, which django-stubs do not declare (hence the ignores).
    def _start_transaction_under_autocommit(self) -> None:
        self._writer_lock()
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]  # not in the stubs
        except OperationalError as exc:
            raise self._locked(exc) from exc
        except BaseException:
            self._writer_unlock()
            raise

    def _commit(self) -> None:
        try:
            super()._commit()  # type: ignore[misc]  # not in the stubs
        finally:
            self._writer_unlock()

    def _rollback(self) -> None:
        try:
            super()._rollback()  # type: ignore[misc]  # not in the stubs
        finally:
            self._writer_unlock()

    def _close(self) -> None:
        try:
            super()._close()  # type: ignore[misc]  # not in the stubs
        finally:
            self._writer_unlock()
            if self._writer_fd is not None:
                os.close(self._writer_fd)
                self._writer_fd = None
