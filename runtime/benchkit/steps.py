"""Durable steps in process: one driver, concurrency 1, zero-latency LLM, no-op tools.

Commits and statements are counted on the connection (``runtime.storage.sqlite.instrument``), not
assumed.
"""

from __future__ import annotations

import time
from typing import Any

from django.db import connection, transaction

from runtime.agents.agent import registry
from runtime.benchkit.agents import AGENTS
from runtime.clock import SYSTEM_CLOCK
from runtime.leasing.heartbeat import LeaseKeeper
from runtime.loop.driver import Driver
from runtime.storage.postgres.instrument import PgTrace
from runtime.storage.runs import run_create
from runtime.storage.sqlite.instrument import SqliteCounter


def create_runs(agent: str, count: int, steps: int | None = None, batch: int = 500) -> list[int]:
    """Queue ``count`` runs, many per transaction (each with its ``run.created`` event)."""
    data = {"steps": steps} if steps is not None else {}
    ids: list[int] = []
    while len(ids) < count:
        with transaction.atomic():
            for _ in range(min(batch, count - len(ids))):
                ids.append(run_create(agent, data, created_by="bench",
                                      now=SYSTEM_CLOCK.now()).pk)
    return ids


def _drive_all(ids: list[int]) -> tuple[float, Any]:
    driver = Driver(name="bench", lease_seconds=30, keeper=LeaseKeeper(30))  # no thread
    counter = PgTrace() if connection.vendor == "postgresql" else SqliteCounter()
    with counter:
        start = time.perf_counter()
        for run_id in ids:
            run = driver.drive(run_id)
            if run.status != "succeeded":
                raise RuntimeError(f"bench run {run_id} ended {run.status}")
        elapsed = time.perf_counter() - start
    return elapsed, counter


def durable_steps(agent: str, runs: int, steps: int = 10) -> dict[str, Any]:
    """Runs of ``steps`` tool steps: steps/s, commits and statements per step (all in, claim
    and final answer included), and what one more step costs as a run grows (steady state):
    the difference between runs of ``steps``, ``2 * steps`` and ``10 * steps`` tool steps."""
    with registry.override(*AGENTS):
        _drive_all(create_runs(agent, 3, steps))  # warm: imports, caches, first pages
        ids = create_runs(agent, runs, steps)
        elapsed, counted = _drive_all(ids)
        lengths = (steps, 2 * steps, 10 * steps)
        per_run = {n: _drive_all(create_runs(agent, 1, n))[1] for n in lengths}
    a, b, c = (per_run[n] for n in lengths)
    total = runs * steps
    out: dict[str, Any] = {
        "agent": agent, "engine": connection.vendor, "runs": runs, "steps_per_run": steps,
        "steps": total, "seconds": elapsed, "steps_per_s": total / elapsed,
        "run_lengths": list(lengths),
    }
    # SQLite: synced commits (each a flush) and statements; PostgreSQL: round trips (each a
    # wait on the server, the commit's flush included) and statements.
    for name in ("commits", "statements") if out["engine"] == "sqlite" else (
            "round_trips", "statements"):
        out[f"{name}_per_step"] = getattr(counted, name) / total
        out[f"steady_{name}_per_step"] = (getattr(b, name) - getattr(a, name)) / (
            lengths[1] - lengths[0])
        out[f"late_{name}_per_step"] = (getattr(c, name) - getattr(b, name)) / (
            lengths[2] - lengths[1])
    if out["engine"] == "sqlite":
        out["rollbacks"] = counted.rollbacks
    return out
