"""Lease owners and the heartbeat that keeps leases alive while a run is executing.

The heartbeat runs on its own thread, so it has its own database connection (Django
connections are per thread) and a tool that holds the loop's connection cannot starve it.
Each beat renews every lease the process holds in one statement, before it writes anything
else; a database fault costs that beat only (the connection is dropped, the next beat opens a
new one), and a lease it could not renew simply runs out: the fence then refuses the loop's
next outside call.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connection

from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.leasing.lease import Lease
from runtime.storage.connections import close_connection
from runtime.storage.engines import engine

log = logging.getLogger("runtime.lease")


def make_owner(name: str = "runtime") -> str:
    """name@host:pid:random — two processes (or drivers) configured alike never share a lease."""
    return f"{name}@{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def lease_renew(leases: list[Lease], *, lease_seconds: float, clock: Any = SYSTEM_CLOCK
                ) -> list[Lease]:
    """Extend every lease in ``leases`` its owner still holds unexpired, in one statement
    (compare-and-set on owner and epoch); returns those that were not renewed.

    An expired lease is never revived: once lapsed it is lost, even if nobody took the run.
    """
    if not leases:
        return []
    renewed = engine().renew(leases, lease_seconds, clock)
    missed = []
    for lease in leases:
        expires = renewed.get((lease.run_id, lease.epoch, lease.owner))
        if expires is not None:
            lease.expires_at = expires
        else:
            missed.append(lease)
    return missed


class LeaseKeeper:
    """Renews every lease it is given, every third of the lease length, on its own thread."""

    def __init__(
        self,
        lease_seconds: float,
        *,
        clock: Clock = SYSTEM_CLOCK,
        interval: float | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        self.lease_seconds = lease_seconds
        self.interval = interval if interval is not None else lease_seconds / 3
        self.clock = clock
        self.on_tick = on_tick
        self.ticks = 0
        self._leases: set[Lease] = set()
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, lease: Lease) -> None:
        with self._lock:
            self._leases.add(lease)

    def discard(self, lease: Lease) -> None:
        with self._lock:
            self._leases.discard(lease)

    def held(self) -> list[Lease]:
        with self._lock:
            return list(self._leases)

    def start(self) -> LeaseKeeper:
        self._thread = threading.Thread(target=self._loop, name="lease-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        # A fixed cadence from one renewal's start to the next: a slow link or a slow tick
        # must not stretch the time between renewals by its own length.
        due = time.monotonic() + self.interval
        try:
            while not self._stop.wait(max(0.0, due - time.monotonic())):
                due = max(due + self.interval, time.monotonic())
                self.renew_now()
        finally:
            connection.close()

    def renew_now(self) -> None:
        """One heartbeat: renew all held leases in one statement, then the rest (``on_tick``).

        A lease not renewed is lost, unless its run ended meanwhile: the loop marks a lease
        ``ending`` before the commit that gives it up, and drops it from the keeper after.
        """
        try:
            missed = lease_renew(self.held(), lease_seconds=self.lease_seconds,
                                 clock=self.clock)
            with self._lock:
                lost = [lease for lease in missed
                        if lease in self._leases and not lease.ending]
                for lease in lost:
                    lease.lost = True
                    self._leases.discard(lease)
            for lease in lost:
                log.warning("run=%s lease lost (owner %s, epoch %s)", lease.run_id,
                            lease.owner, lease.epoch)
            if self.on_tick is not None:
                self.on_tick()
        except Exception as exc:  # a failed beat must not kill the thread; the next one retries
            log.warning("heartbeat failed: %s", " ".join(str(exc).split())[:300]
                        or type(exc).__name__)
            close_connection()
        finally:
            with self._cond:
                self.ticks += 1
                self._cond.notify_all()

    def wait_ticks(self, n: int, timeout: float) -> bool:
        """Block until ``n`` more heartbeats have run (for tests and shutdown)."""
        with self._cond:
            target = self.ticks + n
            return self._cond.wait_for(lambda: self.ticks >= target, timeout)
