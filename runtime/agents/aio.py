"""Async tools and models, on either kind of worker.

On the event-loop worker (``runtime.worker.eventloop``) each run in flight is a task on one
asyncio loop, and the run's code (the loop of design §5, written once, synchronously) runs in
a greenlet of that task: where it waits (a commit, a blocking tool or model, an awaitable, a
backoff) it hands the wait to the loop (``wait_for``) and the loop runs other runs meanwhile.
While the run's own code runs, the loop is hidden from it, so the ORM's reads (which refuse to
run inside a running loop) work as on any thread; the greenlet never switches inside one.

On the thread worker, and in ``runtime.resume``, each thread keeps one event loop and runs a
tool's or a model's coroutine on it to the end, so an async client made in one call is still
bound to a live loop in the next. Django's ORM refuses to run inside a running loop, so what a
coroutine asks of the database (``ctx.dispatch()``) runs on a short-lived thread of its own
while the coroutine waits.
"""

from __future__ import annotations

import asyncio
import threading
import time
from asyncio import events
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from functools import partial
from typing import Any, TypeVar, cast

import greenlet
from django.db import connection

T = TypeVar("T")

_local = threading.local()


class RunGreenlet(greenlet.greenlet):
    """A run's synchronous code on the event loop's thread, and where its waits go."""

    def __init__(self, fn: Callable[..., Any], loop: asyncio.AbstractEventLoop,
                 blocking: Executor | None) -> None:
        super().__init__(fn)
        self.loop = loop
        self.blocking = blocking  # the bounded pool for sync tools and models (None: here)


def run_greenlet() -> RunGreenlet | None:
    """The run greenlet this code runs in, or None (a thread's own code)."""
    g = greenlet.getcurrent()
    return g if isinstance(g, RunGreenlet) else None


async def run_in_greenlet(fn: Callable[..., T], *args: Any, blocking: Executor | None) -> T:
    """``fn(*args)`` on this loop's thread, each of its waits awaited here (other tasks run
    meanwhile); its value, or what it raised. Cancelling the task raises in ``fn`` where it
    waits."""
    loop = asyncio.get_running_loop()

    def body(*a: Any) -> T:
        events._set_running_loop(None)  # the ORM reads as on any thread
        try:
            return fn(*a)
        finally:
            events._set_running_loop(loop)

    g = RunGreenlet(body, loop, blocking)
    value: Any = g.switch(*args)
    while not g.dead:
        try:
            result = await value
        except BaseException as exc:  # into the run's code, where it waited
            value = g.throw(exc)
        else:
            value = g.switch(result)
    return cast(T, value)


def wait_for(awaitable: Awaitable[T]) -> T:
    """``awaitable``'s result: in a run greenlet awaited by its task on the worker's loop
    (other runs go on meanwhile); elsewhere run on this thread's loop."""
    g = run_greenlet()
    if g is None:
        return run_awaitable(awaitable)
    assert g.parent is not None, "a run greenlet is switched to by its task"
    events._set_running_loop(g.loop)
    try:
        return cast(T, g.parent.switch(awaitable))
    finally:
        events._set_running_loop(None)


def call_in(executor: Executor | None, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on ``executor``'s threads while a run greenlet waits for it; called here
    on any other thread (or with no executor)."""
    g = run_greenlet()
    if g is None or executor is None:
        return fn(*args)
    return wait_for(g.loop.run_in_executor(executor, partial(fn, *args)))


def call_blocking(fn: Callable[..., T], *args: Any) -> T:
    """A call that may block (a sync tool, a sync model client): in a run greenlet, on the
    worker's bounded pool; elsewhere here."""
    g = run_greenlet()
    return fn(*args) if g is None else call_in(g.blocking, fn, *args)


def pause(seconds: float) -> None:
    """Let ``seconds`` pass: the loop runs other runs meanwhile; a thread sleeps."""
    if run_greenlet() is None:
        time.sleep(seconds)
    else:
        wait_for(asyncio.sleep(seconds))


def run_awaitable(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` to its end: on the worker's loop from a run greenlet, else on this
    thread's loop (made the first time)."""
    if run_greenlet() is not None:
        return wait_for(awaitable)
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
            outcome["value"] = _call_closing(fn)
        except BaseException as exc:  # a simulated crash or a lost lease: the caller's to see
            outcome["error"] = exc

    worker = threading.Thread(target=call, name="off-the-loop")
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


async def off_the_loop_async(fn: Callable[[], T]) -> T:
    """``fn()`` on a thread of its own (its database connection closed after), awaited: the
    loop runs on meanwhile. Whatever ``fn`` raises, ``BaseException`` included, is raised
    here."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Any, failed: bool) -> None:
        if not future.done():
            (future.set_exception if failed else future.set_result)(outcome)

    def call() -> None:
        try:
            value = _call_closing(fn)
        except BaseException as exc:  # the awaiting tool's to see
            loop.call_soon_threadsafe(settle, exc, True)
        else:
            loop.call_soon_threadsafe(settle, value, False)

    threading.Thread(target=call, name="off-the-loop").start()
    return await future


def _call_closing(fn: Callable[[], T]) -> T:
    try:
        return fn()
    finally:
        connection.close()
