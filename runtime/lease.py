"""Lease owners and the heartbeat that keeps leases alive while a run is executing.

The heartbeat runs on its own thread, so it has its own database connection (Django
connections are per thread) and a tool that holds the loop's connection cannot starve it.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import connection, transaction

from .clock import SYSTEM_CLOCK, Clock
from .models import Run, RunStatus
from .store import Lease

log = logging.getLogger("runtime.lease")


def make_owner(name: str = "runtime") -> str:
    """name@host:pid:random — two processes (or drivers) configured alike never share a lease."""
    return f"{name}@{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def lease_renew(lease: Lease, *, lease_seconds: float, now: datetime) -> bool:
    """Extend a lease this owner still holds and that has not yet expired (compare-and-set).

    An expired lease is never revived: once lapsed it is lost, even if nobody took the run.
    """
    expires = now + timedelta(seconds=lease_seconds)
    updated = Run.objects.filter(
        pk=lease.run_id, status=RunStatus.RUNNING, lease_owner=lease.owner,
        lease_epoch=lease.epoch, lease_expires_at__gt=now,
    ).update(lease_expires_at=expires)
    if updated == 1:
        lease.expires_at = expires
        return True
    return False


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
        try:
            while not self._stop.wait(self.interval):
                self.renew_now()
        finally:
            connection.close()

    def renew_now(self) -> None:
        """One heartbeat: renew all held leases in one transaction; mark lost ones."""
        leases = self.held()
        now = self.clock.now()
        try:
            if leases:
                with transaction.atomic():
                    lost = [lease for lease in leases
                            if not lease_renew(lease, lease_seconds=self.lease_seconds, now=now)]
                for lease in lost:
                    lease.lost = True
                    self.discard(lease)
                    log.warning("run=%s lease lost (owner %s, epoch %s)", lease.run_id,
                                lease.owner, lease.epoch)
            if self.on_tick is not None:
                self.on_tick()
        except Exception:  # a failed heartbeat must not kill the thread; the next one retries
            log.exception("heartbeat failed")
        finally:
            with self._cond:
                self.ticks += 1
                self._cond.notify_all()

    def wait_ticks(self, n: int, timeout: float) -> bool:
        """Block until ``n`` more heartbeats have run (for tests and shutdown)."""
        with self._cond:
            target = self.ticks + n
            return self._cond.wait_for(lambda: self.ticks >= target, timeout)
