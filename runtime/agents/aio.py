"""Async tools and models on a worker's threads: each thread keeps one event loop and runs a
tool's or a model's coroutine on it to the end, so an async client (httpx's, an SDK's) made in
one call is still bound to a live loop in the next.

Django's ORM refuses to run inside a running loop, so what a coroutine asks of the database
(``ctx.dispatch()``) runs on a short-lived thread of its own while the coroutine waits.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from django.db import connection

T = TypeVar("T")

_local = threading.local()


def run_awaitable(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` to its end on this thread's loop (made the first time)."""
    loop = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _local.loop = loop
    return loop.run_until_complete(awaitable)


def in_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def off_the_loop(fn: Callable[[], T]) -> T:
    """``fn()`` on a thread of its own (its database connection closed after), waited for:
    what a coroutine running on this thread's loop asks of the database. Whatever ``fn``
    raises, ``BaseException`` included, is raised here."""
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # a simulated crash or a lost lease: the caller's to see
            outcome["error"] = exc
        finally:
            connection.close()

    worker = threading.Thread(target=call, name="off-the-loop")
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
