"""Canonical JSON: one byte string per value, for hashes, digests and size limits."""

from __future__ import annotations

import hashlib
import json
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
    """Return ``value`` as plain JSON data, or raise InvalidPayload (not JSON, too large)."""
    try:
        text = dumps(value)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(what, f"not JSON-serialisable ({exc})") from None
    limit = max_payload_bytes()
    size = len(text.encode())
    if size > limit:
        raise InvalidPayload(what, f"{size} bytes is larger than the limit of {limit} bytes")
    return json.loads(text)


def request_digest(tool: str, arguments: Any, effect: str) -> str:
    """The digest an approval is bound to: the decided request, nothing else."""
    return digest({"tool": tool, "arguments": arguments, "effect": effect})
