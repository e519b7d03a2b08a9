"""Schemathesis hooks for the fuzz runs (loaded by ``SCHEMATHESIS_HOOKS``). Every other
generated run start names an agent the test server has, so starts succeed and the stateful
phase can follow a started run's links. Decided from the generated data alone, so fixed seeds
give the same cases each run."""

from __future__ import annotations

import itertools
from typing import Any

import schemathesis

KNOWN_AGENT = "payout"  # tests.console.agents.AGENTS, which the test server runs


@schemathesis.hook("map_body")
def start_a_known_agent(context: Any, body: Any) -> Any:
    if context.operation is not None and context.operation.label == "POST /api/runs" \
            and isinstance(body, dict) and isinstance(body.get("agent"), str) \
            and len(body["agent"]) % 2 == 0:
        return {**body, "agent": KNOWN_AGENT}
    return body


_keys = itertools.count(1)


@schemathesis.hook("map_headers")
def a_fresh_idempotency_key(context: Any, headers: Any) -> Any:
    """Generated keys repeat ("0", "00"), and a key used for another request is refused
    (tests/console/test_api.py pins that): numbered, a request the fuzzer sends is a new one,
    so decisions along the links get past the key to the runtime's rules."""
    key = headers.get("Idempotency-Key") if isinstance(headers, dict) else None
    if isinstance(key, str) and key.isascii() and key.isprintable() and 0 < len(key) <= 180:
        return {**headers, "Idempotency-Key": f"{key}-{next(_keys)}"}
    return headers
