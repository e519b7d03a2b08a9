"""What a worker process runs on: its slots (long-lived executor threads, each keeping its
database connection) and the wake-up flag its idle loop waits on."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import threading
from collections.abc import Callable

from django.db import connection

from runtime.leasing.claims import Acquired
from runtime.storage.connections import connection_release

log = logging.getLogger("runtime.worker")


class Wakeup:
    """A flag that also wakes a ``select()``: set from any thread or a signal handler, so an
    idle worker waiting on its listening socket wakes at once when a slot frees or a stop is
    asked for. Lock-free (a plain attribute and a pipe), so a signal handler setting it while
    the main thread clears it cannot deadlock; a byte in the pipe counts as set."""

    def __init__(self) -> None:
        self._set = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def set(self) -> None:
        self._set = True
        # Full: a wake-up is pending anyway; closed: the worker has stopped waiting.
        with contextlib.suppress(OSError):
            os.write(self._write, b"\0")

    def is_set(self) -> bool:
        return self._set

    def clear(self) -> None:
        self._set = False
        with contextlib.suppress(OSError):
            while os.read(self._read, 4096):
                pass

    def wait(self, timeout: float, fd: int | None = None) -> tuple[bool, bool]:
        """Block up to ``timeout`` seconds: (this was set, ``fd`` is readable)."""
        fds = [self._read] if fd is None else [self._read, fd]
        ready = select.select(fds, [], [], max(timeout, 0.0))[0]
        return self._set or self._read in ready, fd is not None and fd in ready

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


class Slot:
    """One of a worker's ``concurrency`` executor threads. It lives as long as the worker, so
    a run costs no thread. It keeps its database connection, unless the worker has more threads
    than its PostgreSQL pool has connections: then it borrows one only while its run talks to
    the database (``storage.connections.connection_release``)."""

    def __init__(self, name: str, execute: Callable[[Slot, Acquired], None]) -> None:
        """``execute(slot, acquired)`` runs one claimed run on the slot's thread and hands the
        slot back when done (the worker's ``execute``)."""
        self.execute = execute
        self._inbox: queue.SimpleQueue[Acquired | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, daemon=True, name=name)
        self.thread.start()

    def give(self, acquired: Acquired) -> None:
        self._inbox.put(acquired)

    def stop(self) -> None:
        self._inbox.put(None)

    def _loop(self) -> None:
        try:
            while (acquired := self._inbox.get()) is not None:
                try:
                    self.execute(self, acquired)
                except BaseException:  # what ended a run's own thread before: not the slot
                    # (execute has already returned the slot and closed a connection left in
                    # a transaction)
                    log.exception("run=%s: stopped by a BaseException", acquired.run.pk)
        finally:
            try:
                connection.close()
            except Exception:
                log.exception("closing a slot's connection failed")


def settle_connection() -> None:
    """A slot keeps its connection from run to run, but never an open transaction (and the
    write lock with it): if a failure left one behind, the connection goes. Where a pool lends
    connections, the slot gives its own back while it waits for a run."""
    try:
        raw = connection.connection  # sqlite3 says whether a transaction is open
        if raw is not None and getattr(raw, "in_transaction", False):
            connection.close()
        connection_release()
    except Exception:
        log.exception("closing a connection left in a transaction failed")
