"""Keyset cursors: what a page's ``next_cursor`` holds (base64 of a small JSON list), read
back strictly: a cursor the API did not give out is a 422, never a server error."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Any

from console.api.errors import ApiError


def cursor_encode(value: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def cursor_decode(cursor: str) -> list[Any]:
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
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
        if when.tzinfo is None or not isinstance(pk, int) or isinstance(pk, bool):
            raise ValueError
    except (ValueError, TypeError):
        raise ApiError("invalid", "cursor is not one this API gave out") from None
    return when, pk


def event_cursor(cursor: str | None) -> int:
    if not cursor:
        return 0
    value = cursor_decode(cursor)
    if len(value) != 1 or not isinstance(value[0], int) or isinstance(value[0], bool):
        raise ApiError("invalid", "cursor is not one this API gave out")
    return value[0]
