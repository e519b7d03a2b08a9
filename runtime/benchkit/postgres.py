"""The bench on PostgreSQL (``DATABASE_URL=postgres://... manage.py bench``).

It runs on a fresh database of its own on the same server (``runtime_bench_<pid>``, dropped at
the end unless kept) and, for the ratio the targets are stated in, on a fresh SQLite file under
``var/`` measured in the same run, the two interleaved so a noisy neighbour weighs on both:
the server's own commit ceiling beside SQLite's, durable steps in one process (round trips
counted from libpq's trace), and real ``runworker`` processes, 1, 2 and 4 of them.
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings
from django.core.management import call_command
from django.db import DEFAULT_DB_ALIAS

from runtime.benchkit import workers
from runtime.benchkit.ceiling import ceiling as sqlite_ceiling
from runtime.benchkit.db import sqlite_config, use_database
from runtime.benchkit.floor import cpu_scaling
from runtime.benchkit.steps import durable_steps

PROCESSES = (1, 2, 4)
IN_FLIGHT_RUNS = 16  # runs in flight per worker on the in-flight line
IN_FLIGHT = ((1, "threads"), (1, "asyncio"), (2, "asyncio"))  # (processes, --loop)


def _url(config: dict[str, Any], name: str) -> str:
    user = config.get("USER") or ""
    password = f":{config['PASSWORD']}" if config.get("PASSWORD") else ""
    at = f"{user}{password}@" if user else ""
    host = config.get("HOST") or "localhost"
    port = f":{config['PORT']}" if config.get("PORT") else ""
    return f"postgresql://{at}{host}{port}/{name}"


@contextmanager
def bench_databases(directory: Path, keep: bool = False) -> Iterator[dict[str, Any]]:
    """A fresh migrated PostgreSQL database beside the configured one, and a fresh SQLite
    file in ``directory``; yields their settings and the PostgreSQL URL."""
    original = copy.deepcopy(settings.DATABASES[DEFAULT_DB_ALIAS])
    name = f"runtime_bench_{os.getpid()}"
    admin = psycopg.connect(_url(original, original.get("NAME") or "postgres"),
                            autocommit=True)
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.execute(f'CREATE DATABASE "{name}"')
    pg = {**copy.deepcopy(original), "NAME": name}
    lite = sqlite_config(directory / "bench.sqlite3")
    try:
        for config in (pg, lite):
            use_database(config)
            call_command("migrate", verbosity=0, interactive=False)
        yield {"postgres": pg, "sqlite": lite, "url": _url(pg, name)}
    finally:
        use_database(original)
        if not keep:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def ceiling(url: str, seconds: float) -> float:
    """Commits/s of plain psycopg: one small INSERT per autocommit statement, prepared."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_ceiling (id bigserial PRIMARY KEY, "
                     "v text)")
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            conn.execute("INSERT INTO bench_ceiling (v) VALUES (%s)", ("x",), prepare=True)
            n += 1
        conn.execute("DROP TABLE bench_ceiling")
    return n / elapsed


def measure(dbs: dict[str, Any], logs: Path, size: dict[str, Any],
            step: Any) -> dict[str, Any]:
    """Every PostgreSQL section; ``step(name)`` marks where the time goes."""
    r: dict[str, Any] = {"engine": "postgresql"}
    step("ceilings: postgresql and sqlite")
    pg, lite = [], []
    for _ in range(size["rounds"]):  # interleaved: the disk's mood weighs on both alike
        pg.append(ceiling(dbs["url"], size["ceiling_seconds"]))
        lite.append(sqlite_ceiling(logs.parent, size["ceiling_seconds"]))
    r["ceiling"] = {"commits_per_s": statistics.median(pg), "samples": pg,
                    "sqlite_commits_per_s": statistics.median(lite), "sqlite_samples": lite}
    step("postgresql and sqlite: durable steps, interleaved")
    rounds: dict[str, list[dict[str, Any]]] = {"postgresql": [], "sqlite": []}
    for _ in range(size["rounds"]):
        for engine, config in (("sqlite", dbs["sqlite"]), ("postgresql", dbs["postgres"])):
            use_database(config)
            rounds[engine].append(durable_steps("bench_read", size["step_runs"]))
    r["steps"] = {engine: _median_round(found) for engine, found in rounds.items()}
    r["steps"]["ratio"] = (r["steps"]["postgresql"]["steps_per_s"]
                           / r["steps"]["sqlite"]["steps_per_s"])
    use_database(dbs["postgres"])
    step("cpu scaling")
    r["cpu_scaling"] = cpu_scaling(size["cpu_seconds"])
    r["processes"] = []
    for n in PROCESSES:
        step(f"postgresql: {n} process(es) x 1 thread")
        r["processes"].append(workers.throughput(dbs["url"], logs, processes=n, threads=1,
                                               runs=size["worker_runs"]))
    # Many runs in flight: a thread per run against the event loop, then two event-loop
    # workers, in interleaved rounds.
    found: dict[tuple[int, str], list[dict[str, Any]]] = {c: [] for c in IN_FLIGHT}
    for k in range(size["rounds"]):
        for n, loop in IN_FLIGHT:
            step(f"postgresql: {n} process(es) x {IN_FLIGHT_RUNS} in flight, --loop {loop}, "
                 f"round {k + 1}")
            found[n, loop].append(workers.throughput(
                dbs["url"], logs, processes=n, threads=IN_FLIGHT_RUNS, loop=loop,
                runs=size["worker_runs"] * IN_FLIGHT_RUNS // 4 * n))
    r["inflight"] = [_median_round(found[c]) for c in IN_FLIGHT]
    return r


def _median_round(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median steps/s, and every round's figure beside it."""
    ordered = sorted(found, key=lambda s: s["steps_per_s"])
    mid = dict(ordered[len(ordered) // 2])
    mid["rounds_steps_per_s"] = [round(s["steps_per_s"], 1) for s in found]
    return mid


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(name: str, met: bool, figure: str) -> None:
        out.append({"target": name, "met": bool(met), "figure": figure})

    pg, lite = r["steps"]["postgresql"], r["steps"]["sqlite"]
    pg_ceiling, lite_ceiling = r["ceiling"]["commits_per_s"], r["ceiling"]["sqlite_commits_per_s"]
    add("PostgreSQL steps/s >= 0.8 x SQLite's (one process, concurrency 1, same run)",
        r["steps"]["ratio"] >= 0.8,
        f"{pg['steps_per_s']:.0f} vs {lite['steps_per_s']:.0f} steps/s = "
        f"{r['steps']['ratio']:.2f}x (a synced commit alone: {pg_ceiling:,.0f} vs "
        f"{lite_ceiling:,.0f} commits/s = {pg_ceiling / lite_ceiling:.2f}x)")
    steady = pg["steady_round_trips_per_step"]
    add("round trips per steady-state step <= 4", steady <= 4,
        f"{steady:g} steady ({pg['round_trips_per_step']:.2f} all in, claim and final "
        f"answer included)")
    by = {c["processes"]: c for c in r["processes"]}
    if 1 in by and 2 in by:
        gain = by[2]["steps_per_s"] / max(by[1]["steps_per_s"], 1e-9)
        add("PostgreSQL: 2 processes >= 1.6 x 1 process", gain >= 1.6,
            f"{by[2]['steps_per_s']:.0f} vs {by[1]['steps_per_s']:.0f} steps/s = {gain:.2f}x "
            f"(the machine: {r['cpu_scaling']:.2f}x for two busy processes; the server's "
            "own processes share its cores)")
    at = {(c["processes"], c["loop"]): c for c in r.get("inflight", [])}
    if (1, "threads") in at and (1, "asyncio") in at:
        threads, loop = at[1, "threads"], at[1, "asyncio"]
        add(f"PostgreSQL, {IN_FLIGHT_RUNS} in flight: event loop >= thread per run",
            loop["steps_per_s"] >= threads["steps_per_s"],
            f"{loop['steps_per_s']:.0f} vs {threads['steps_per_s']:.0f} steps/s = "
            f"{loop['steps_per_s'] / max(threads['steps_per_s'], 1e-9):.2f}x; CPU "
            f"{loop['cpu_ms_per_step']:.2f} vs {threads['cpu_ms_per_step']:.2f} ms/step")
    if (1, "asyncio") in at and (2, "asyncio") in at:
        one, two = at[1, "asyncio"], at[2, "asyncio"]
        gain = two["steps_per_s"] / max(one["steps_per_s"], 1e-9)
        add(f"PostgreSQL, {IN_FLIGHT_RUNS} in flight each: 2 workers >= 1.6 x one",
            gain >= 1.6, f"{two['steps_per_s']:.0f} vs {one['steps_per_s']:.0f} steps/s = "
            f"{gain:.2f}x")
    ok = all(c["succeeded"] == c["runs"] and not c["overran"] and c["tracebacks"] == 0
             for c in r["processes"] + r.get("inflight", []))
    add("every PostgreSQL bench run succeeded, no worker overran or crashed", ok,
        "yes" if ok else "no (see the processes section)")
    return out


def render(r: dict[str, Any]) -> str:
    pg, lite = r["steps"]["postgresql"], r["steps"]["sqlite"]
    rows = [
        ("Ceilings: one small INSERT per synced commit, plain psycopg (autocommit) / plain "
         "sqlite3 (WAL, synchronous=FULL), interleaved",
         f"{r['ceiling']['commits_per_s']:,.0f} / {r['ceiling']['sqlite_commits_per_s']:,.0f} "
         f"commits/s ({r['ceiling']['commits_per_s'] / r['ceiling']['sqlite_commits_per_s']:.2f}"
         " x)"),
        ("Durable steps, one process, concurrency 1, no-op tools: PostgreSQL / SQLite "
         "(median of interleaved rounds)",
         f"{pg['steps_per_s']:.0f} / {lite['steps_per_s']:.0f} steps/s "
         f"({r['steps']['ratio']:.2f} x; rounds {pg['rounds_steps_per_s']} / "
         f"{lite['rounds_steps_per_s']})"),
        ("PostgreSQL round trips per step (steady state / all-in)",
         f"{pg['steady_round_trips_per_step']:g} / {pg['round_trips_per_step']:.2f}"),
        ("PostgreSQL statements per step (steady state)",
         f"{pg['steady_statements_per_step']:g}"),
        ("`runworker` on PostgreSQL, " + ", ".join(str(c["processes"]) for c in r["processes"])
         + " processes x 1 thread",
         ", ".join(f"{c['steps_per_s']:.0f}" for c in r["processes"]) + " steps/s (p99 step "
         + ", ".join(f"{c['p99_ms']:.0f}" for c in r["processes"]) + " ms)"),
    ]
    rows += [(f"`runworker` on PostgreSQL, {c['processes']} process(es) x {c['threads']} in "
              f"flight, --loop {c['loop']} (median of interleaved rounds)",
              f"{c['steps_per_s']:.0f} steps/s, CPU {c['cpu_ms_per_step']:.2f} ms/step (p99 "
              f"step {c['p99_ms']:.0f} ms; rounds {c['rounds_steps_per_s']})")
             for c in r.get("inflight", [])]
    lines = ["| Measure | Result |", "|---|---|"]
    lines += [f"| {a} | {b} |" for a, b in rows]
    lines += ["", "| Target | Met | Figure |", "|---|---|---|"]
    lines += [f"| {t['target']} | {'yes' if t['met'] else 'NO'} | {t['figure']} |"
              for t in r["targets"]]
    return "\n".join(lines) + "\n"
