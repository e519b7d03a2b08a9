"""Keyset cursors: what a page's ``next_cursor`` holds (base64 of a small JSON list), read
back strictly: a cursor the API did not give out is a 422, never a server error."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime
from typing import Any

from ninja import Query

from console.api.errors import ApiError

# The query parameter: what cursor_encode writes (unpadded base64url), and never long.
CURSOR: Any = Query(None, max_length=500, pattern=r"^[A-Za-z0-9_-]*$",
                    description="A page's next_cursor, as given.")


def cursor_encode(value: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def cursor_decode(cursor: str) -> list[Any]:
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):
        value = None
    if not isinstance(value, list):
        raise ApiError("invalid", "cursor is not one this API gave out",
                       errors=[{"loc": ["query", "cursor"], "msg": "unknown cursor",
                                "type": "value_error"}])
    return value


def approval_cursor(cursor: str | None) -> tuple[datetime, int] | None:
    if not cursor:
        return None
    value = cursor_decode(cursor)
    try:
        created, pk = value
        when = datetime.fromisoformat(created)
        if when.tzinfo is None or not _row_id(pk):
            raise ValueError
        when.astimezone(UTC)  # as the database compares it: a date past year 9999 overflows
    except (ValueError, TypeError, OverflowError):
        raise ApiError("invalid", "cursor is not one this API gave out") from None
    return when, pk


def _row_id(value: Any) -> bool:
    """A whole number a database column holds (a larger one overflows in the driver)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def event_cursor(cursor: str | None) -> int:
    if not cursor:
        return 0
    value = cursor_decode(cursor)
    if len(value) != 1 or not _row_id(value[0]):
        raise ApiError("invalid", "cursor is not one this API gave out")
    return value[0]
