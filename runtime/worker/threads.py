"""A bounded pool of daemon threads for the event-loop worker's waits off the loop.

``concurrent.futures.ThreadPoolExecutor`` joins its threads when the interpreter exits, so a
tool stuck in a call that never returns would keep a stopped worker alive forever; a worker's
calls past their grace period die with the process instead, as a slot thread's always did.
Threads are made as calls arrive while every thread is busy, up to ``limit``; then calls queue.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from django.db import connection

log = logging.getLogger("runtime.worker")


class DaemonPool(Executor):
    """Up to ``limit`` daemon threads running submitted calls, first come first served."""

    def __init__(self, limit: int, name: str,
                 after: Callable[[], None] | None = None) -> None:
        """``after()`` runs on the thread after each call (what a call leaves behind, such as
        a database connection, given back)."""
        self.limit, self.name, self.after = limit, name, after
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue())
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: the pool is shut down")
            if self._idle <= 0 and len(self._threads) < self.limit:
                thread = threading.Thread(target=self._serve, daemon=True,
                                          name=f"{self.name}-{len(self._threads)}")
                self._threads.append(thread)
                self._idle += 1
                thread.start()
            self._idle -= 1
        self._calls.put((future, lambda: fn(*args, **kwargs)))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more calls; each thread ends after the call it is in (``wait``: joined)."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._calls.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._calls.put(None)
        if wait:
            for thread in threads:
                thread.join()

    @property
    def threads(self) -> int:
        """Threads made so far (they live as long as the pool)."""
        return len(self._threads)

    def _after(self) -> None:
        if self.after is not None:
            try:
                self.after()
            except Exception:
                log.exception("%s: cleaning up after a call failed", self.name)

    def _serve(self) -> None:
        try:
            while (item := self._calls.get()) is not None:
                future, call = item
                if future.set_running_or_notify_cancel():
                    try:
                        value = call()
                    except BaseException as exc:  # a simulated crash, a lost lease: the caller's
                        self._after()
                        future.set_exception(exc)
                    else:
                        self._after()
                        future.set_result(value)
                with self._lock:
                    self._idle += 1
        finally:
            try:
                connection.close()
            except Exception:
                log.exception("%s: closing a thread's connection failed", self.name)
