"""Canonical JSON: one byte string per value, for hashes, digests and size limits."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from django.conf import settings

from .errors import InvalidPayload


def dumps(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept: equal values give equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def digest(value: Any) -> str:
    """SHA-256 hex digest of the canonical JSON of ``value``."""
    return hashlib.sha256(dumps(value).encode()).hexdigest()


def max_payload_bytes() -> int:
    return int(settings.RUNTIME.get("MAX_PAYLOAD_BYTES", 1024 * 1024))


def check_payload(what: str, value: Any) -> Any:
    """Return ``value`` as plain JSON data that both engines store and give back alike, or
    raise InvalidPayload (not JSON, too large, a NUL character)."""
    try:
        text = dumps(value)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(what, f"not JSON-serialisable ({exc})") from None
    limit = max_payload_bytes()
    size = len(text.encode())
    if size > limit:
        raise InvalidPayload(what, f"{size} bytes is larger than the limit of {limit} bytes")
    if _NUL.search(text):
        raise InvalidPayload(what, "contains the NUL character (\\u0000), which PostgreSQL "
                             "cannot store in JSON; send it encoded")
    return json.loads(text, parse_float=_portable_float)


# A \u0000 escape in canonical JSON: preceded by an even number of backslashes (an escaped
# backslash followed by "u0000" is text, not a NUL).
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _portable_float(text: str) -> float | int:
    """A number as PostgreSQL's ``jsonb`` gives it back, so a hash over it holds on both
    engines: ``jsonb`` has no negative zero, and writes 1e+16 out as 10000000000000000 (every
    float that large is a whole number, so it is kept as that integer)."""
    number = float(text)
    if number == 0:
        return 0.0
    if "e+" in text:
        return int(number)
    return number


def request_digest(tool: str, arguments: Any, effect: str) -> str:
    """The digest an approval is bound to: the decided request, nothing else."""
    return digest({"tool": tool, "arguments": arguments, "effect": effect})
