"""Canonical JSON: one byte string per value, for hashes, digests and size limits; and the
limits every payload meets before it is stored (``check_payload``), or before JSON text from
outside is parsed (``parse_json``)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from runtime.conf import DEFAULTS, setting
from runtime.errors import InvalidPayload

# The canonical form's encoder, made once: ``json.dumps`` with these options builds an encoder
# and its C scanner on every call, which cost more than encoding a step's small payloads (a
# step encodes about nine). No circular-reference check: a value that refers to itself
# recurses until the RecursionError below, a ValueError as before.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                            allow_nan=False, check_circular=False)
_C_MAKE_ENCODER = json.encoder.c_make_encoder  # type: ignore[attr-defined]  # typeshed lacks it
_C_ENCODE = None if _C_MAKE_ENCODER is None else _C_MAKE_ENCODER(
    None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", True, False, False)


def dumps(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept: equal values give equal strings.

    A value nested too deeply for the encoder's recursion raises ``ValueError`` (as values JSON
    cannot hold do), not ``RecursionError``; ``check_payload`` refuses such values before."""
    try:
        if _C_ENCODE is not None:
            return "".join(_C_ENCODE(value, 0))
        return _ENCODER.encode(value)
    except RecursionError:
        raise ValueError(f"nested too deeply to encode as JSON (the limit is "
                         f"{max_payload_depth()} levels)") from None


def digest(value: Any) -> str:
    """SHA-256 hex digest of the canonical JSON of ``value``."""
    return hashlib.sha256(dumps(value).encode()).hexdigest()


def max_payload_bytes() -> int:
    return int(setting("MAX_PAYLOAD_BYTES"))


# Objects and arrays nested in a payload, at most (RUNTIME["MAX_PAYLOAD_DEPTH"]). Real tool
# arguments, results and API responses are rarely ten deep. Every page shows payloads with
# recursive code (the pretty-printer, Django's JSON field decoder, inside a template already
# a hundred or more frames down) under Python's recursion limit of 1000: values about 900
# deep broke them. The runtime also wraps a payload a few levels deeper in its events. 32
# keeps a wide margin on both sides; keep any other setting well under a few hundred.
DEFAULT_MAX_PAYLOAD_DEPTH: int = DEFAULTS["MAX_PAYLOAD_DEPTH"]  # runtime.conf: 32


def max_payload_depth() -> int:
    return int(setting("MAX_PAYLOAD_DEPTH"))


_CONTAINERS = (dict, list, tuple)


def nesting_depth(value: Any, cap: int) -> int:
    """How many objects and arrays the deepest path through ``value`` passes: 0 for a
    scalar, 1 for ``[]``, ``[1, 2]`` or ``{"a": "b"}``, 2 for ``{"a": [1]}``; or ``cap + 1``
    as soon as it is known to be deeper than ``cap``.

    Iterative (its own stack of the open containers' iterators, no recursion), so no depth
    raises ``RecursionError``, and a value that contains itself stops at ``cap + 1`` too."""
    if not isinstance(value, _CONTAINERS):
        return 0
    deepest = 1
    stack = [_children(value)]
    while stack:
        for child in stack[-1]:
            if isinstance(child, _CONTAINERS):
                stack.append(_children(child))
                if len(stack) > deepest:
                    deepest = len(stack)
                    if deepest > cap:
                        return cap + 1
                break
        else:  # every child of the innermost open container seen
            stack.pop()
    return deepest


def _children(container: Any) -> Iterator[Any]:
    return iter(container.values() if isinstance(container, dict) else container)


def _too_deep(what: str, limit: int) -> InvalidPayload:
    return InvalidPayload(what, f"nested deeper than {limit} levels")


def check_payload(what: str, value: Any) -> Any:
    """Return ``value`` as plain JSON data that both engines store and give back alike, or
    raise InvalidPayload (nested too deeply, not JSON, too large, a NUL character or a lone
    surrogate). The depth is checked first, without recursion, so no depth raises
    ``RecursionError``."""
    depth = max_payload_depth()
    if nesting_depth(value, depth) > depth:
        raise _too_deep(what, depth)
    try:
        text = dumps(value)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(what, f"not JSON-serialisable ({exc})") from None
    limit = max_payload_bytes()
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise InvalidPayload(what, "contains a lone surrogate (a \\ud800-\\udfff escape "
                             "without its pair), which is not UTF-8 and cannot be "
                             "stored") from None
    if size > limit:
        raise InvalidPayload(what, f"{size} bytes is larger than the limit of {limit} bytes")
    if "\\u0000" in text and _NUL.search(text):  # (the regex only where it can match)
        raise InvalidPayload(what, "contains the NUL character (\\u0000), which PostgreSQL "
                             "cannot store in JSON; send it encoded")
    return _portable_decoder().decode(text)


# A \u0000 escape in canonical JSON: preceded by an even number of backslashes (an escaped
# backslash followed by "u0000" is text, not a NUL).
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


_decoders = threading.local()


def _portable_decoder() -> json.JSONDecoder:
    """This thread's decoder with ``_portable_float`` (made once per thread: ``json.loads``
    with a ``parse_float`` makes one per call, and its scanner calls back into Python)."""
    found = getattr(_decoders, "decoder", None)
    if found is None:
        found = _decoders.decoder = json.JSONDecoder(parse_float=_portable_float)
    return found


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


def parse_json(what: str, text: str | bytes, *, limited: bool = True, **options: Any) -> Any:
    """Parse JSON text from outside (a form, a command line, an API request, an LLM's answer)
    within the payload limits, or raise InvalidPayload: text larger than MAX_PAYLOAD_BYTES is
    refused before it is parsed, and nesting deeper than MAX_PAYLOAD_DEPTH however deep it
    goes (the parser's own ``RecursionError``, some 900 levels down, is caught; shallower
    values are measured once parsed). Text that is not JSON raises ``ValueError``
    (``json.JSONDecodeError``), as ``json.loads`` does; ``options`` go to ``json.loads``.

    ``limited=False`` parses what the parser can (only a ``RecursionError`` is refused, as too
    deep): for values whose limits are applied later, where a refusal means something else
    (an LLM's tool call arguments fail their step, not the LLM's answer). Either way the
    value still has to pass ``check_payload`` before it is stored."""
    depth = max_payload_depth()
    if limited:
        limit = max_payload_bytes()
        size = len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else len(text)
        if size > limit:
            raise InvalidPayload(what, f"{size} bytes is larger than the limit of {limit} bytes")
    try:
        value = json.loads(text, **options)
    except RecursionError:
        raise _too_deep(what, depth) from None
    if limited and nesting_depth(value, depth) > depth:
        raise _too_deep(what, depth)
    return value


def request_digest(tool: str, arguments: Any, effect: str) -> str:
    """The digest an approval is bound to: the decided request, nothing else."""
    return digest({"tool": tool, "arguments": arguments, "effect": effect})


def step_idempotency_key(run_id: int, run_created_at: datetime, index: int) -> str:
    """A step's idempotency key, the same on every attempt and derived from what a restore from a
    backup cannot change: the run (its id and creation time, so a run created after the backup
    whose id is reused gets other keys) and the step's position. A call repeated after a restore
    carries the first call's key, which a provider that honours keys turns into a no-op."""
    seed = hashlib.sha256(f"{run_id}:{iso_time(run_created_at)}".encode()).hexdigest()[:12]
    return f"run{run_id}-step{index}-{seed}"


def chain_hash(prev: str, body: str) -> str:
    """The next link of a hash chain (a run's events, the global creations, a schedule's
    changes, the checkpoints): SHA-256 of the previous link and this entry's canonical JSON."""
    return hashlib.sha256((prev + "\n" + body).encode()).hexdigest()


def iso_time(at: datetime) -> str:
    """A time as the record writes it wherever it is hashed or read back (an event's time, a
    time inside a payload, a chain's entry): UTC, ISO 8601, to the microsecond, whatever zone
    ``at`` came in (``2026-01-01T09:30:00.000000+00:00``)."""
    if at.tzinfo is not UTC:  # a commit's time is UTC already: the same text without a copy
        at = at.astimezone(UTC)
    return at.isoformat(timespec="microseconds")


def iso_time_or_none(at: datetime | None) -> str | None:
    """``iso_time(at)``, or None for no time."""
    return None if at is None else iso_time(at)


def parse_time(text: Any) -> datetime | None:
    """A recorded ISO time, or None when absent or not a time (a comparison then shows it)."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None
