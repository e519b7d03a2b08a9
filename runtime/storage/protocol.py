"""The protocol version the database speaks, so a worker built for another cannot write to it.

Each migration that changes what workers write (an event's meaning, a row's states, how a
lease is fenced) raises the version the database carries. A worker whose code speaks another
version refuses to claim or take over a run: an older one would write events a newer reader
misunderstands, a newer one would write to tables not yet migrated. The verdict is read again
on each worker heartbeat (a forced check), so a running worker notices a database upgraded
under it; elsewhere the first verdict of the process stands.
"""

from __future__ import annotations

import threading
from typing import TypedDict

from django.db import DatabaseError

from runtime.errors import ProtocolMismatch
from runtime.models import Protocol

PROTOCOL_VERSION = 6


class _Verdict(TypedDict):
    checked: bool
    error: ProtocolMismatch | None


_lock = threading.Lock()
_verdict: _Verdict = {"checked": False, "error": None}


def database_protocol() -> int | None:
    """The version the database carries; None when it has none (not migrated)."""

    try:
        return Protocol.objects.values_list("version", flat=True).filter(pk=1).first()
    except DatabaseError as exc:
        if "runtime_protocol" in str(exc):  # the table is missing: migrations not applied
            return None
        raise


def protocol_check(*, force: bool = False) -> None:
    """Raise ``ProtocolMismatch`` unless the database speaks this code's protocol (read once
    per process, or again when ``force``d)."""
    with _lock:
        checked, error = _verdict["checked"], _verdict["error"]
    if force or not checked:
        found = database_protocol()
        error = None if found == PROTOCOL_VERSION else ProtocolMismatch(found, PROTOCOL_VERSION)
        with _lock:
            _verdict["checked"], _verdict["error"] = True, error
    if error is not None:
        raise error


def forget() -> None:
    """Drop the remembered verdict (a test switched databases)."""
    with _lock:
        _verdict["checked"], _verdict["error"] = False, None
