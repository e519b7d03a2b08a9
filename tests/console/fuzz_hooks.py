"""Schemathesis hooks for the fuzz runs (loaded by ``SCHEMATHESIS_HOOKS``): every other
generated run start names an agent the test server has, so starts succeed and the stateful
phase can follow a started run's links. Decided from the generated data alone, so fixed seeds
give the same cases each run."""

from __future__ import annotations

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
