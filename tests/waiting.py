"""The one way tests wait for a state another thread or process reaches: a bounded poll of a
condition (synchronisation, never a fixed sleep standing in for it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str = "condition", timeout: float = 30.0, *,
               interval: float = 0.02) -> T:
    """Poll ``condition`` every ``interval`` seconds until it returns something truthy, and
    return that; fail the test naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
