"""``manage.py bench --console``: the console's and the admin's pages on a big database.

Builds the data set of a busy deployment in the bench's own fresh database (100,000 runs,
10,000 of them waiting on a pending approval, 1,000,000 events and one 5,000-step run;
``--quick``: 2,000 / 200 / 25,000 / 500), then asks every page for itself, in process, through
Django's test client logged in as a superuser, a fresh database connection per request (as
``CONN_MAX_AGE=0`` serves them): p50 and p95 of the server time over N requests, the SQL
queries one request makes and the size of its answer. The target: p95 under 150 ms.

The rows are bulk-inserted (plain sqlite3 ``executemany`` in big transactions, as ``scale``
does; ``COPY`` on PostgreSQL, then ``ANALYZE``) run by run, each run as the runtime writes one:
its steps, approvals and events with real kinds, payload shapes, actors (people, and the
``name@host:pid:hex`` owners of the workers that ran it, most of them long dead) and lease
epochs; each run's events form a valid hash chain
(``runtime.audit.build_events``), so ``verifyaudit`` passes on them. What a run did is drawn
at random (seeded, so every build is the same) within the totals asked for, which are met
exactly: at 10 events a run, most finished runs are a final answer with no tool call (9
events), and the budget left goes to runs that called tools.
"""

from __future__ import annotations

import math
import os
import platform
import random
import sqlite3
import statistics
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.signals import got_request_exception
from django.db import connection, connections
from django.db.models import BooleanField, DecimalField, JSONField, Model
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import reverse

from runtime.admin import ReadOnlyAdmin
from runtime.audit import EventSpec, build_events
from runtime.canonical import dumps, request_digest
from runtime.models import Approval, Event, Run, Step, Worker

TARGET_MS = 150.0
SEED = 14
SPAN = timedelta(days=30)  # the runs were created over the last 30 days
LEASE = 30.0
REFUND_LIMIT_CENTS = 15_000  # refund-desk's policy: refunds above 150.00 need a person
USERS = ("alice", "bob", "carol", "dmitri", "erin", "ops-bot")
ADMIN_USER = "bench-admin"
FILTER_ACTOR = "alice"
FILTER_KIND = "approval.requested"  # a rare kind (about 1 event in 80)
DEEP_KIND = "step.started"  # a common one (about 1 in 9), for a deep page
DEEP_PAGE = 300


@dataclass(frozen=True)
class Sizes:
    runs: int  # every run, the long one included
    pending: int  # runs waiting on a pending approval (one each)
    events: int
    long_steps: int  # the one long run's steps
    reps: int  # timed requests per page


FULL = Sizes(runs=100_000, pending=10_000, events=1_000_000, long_steps=5_000, reps=30)
QUICK = Sizes(runs=2_000, pending=200, events=25_000, long_steps=500, reps=8)

# Shares of the runs (the rest succeeded); of the pending approvals, INTERRUPTED are
# interrupted side effects and the rest policy approvals.
SHARES = {"queued": 0.01, "cancelled": 0.02, "failed": 0.04, "approved": 0.008,
          "resolved": 0.0015}
INTERRUPTED = 0.25
# Agents of the finished runs with no approval, by weight (all registered by default or by
# the bench: see settings.RUNTIME["AGENTS"] and runtime.benchkit.agents).
PLAIN_AGENTS = {"refund-desk": 35, "hello": 20, "bench_read": 15, "bench_write": 10,
                "bench_final": 20}
NATURAL_STEPS = {"refund-desk": 2, "hello": 2, "bench_read": 3, "bench_write": 3,
                 "bench_final": 0}  # tool steps a run of each agent makes when it can
POLICY_STORIES = ("pending_policy", "requeued", "cancelled_waiting", "rejected", "approved")
MAX_EXTRA = 3  # tool steps a bench_read or bench_write run may get to meet the event total

CUSTOMERS = [("Ada Lovelace", "ada@example.com"), ("Grace Hopper", "grace@example.com"),
             ("Alan Turing", "alan@example.com"), ("Edsger Dijkstra", "edsger@example.com"),
             ("Barbara Liskov", "barbara@example.com"), ("Donald Knuth", "don@example.com"),
             ("Margaret Hamilton", "margaret@example.com"), ("Ken Thompson", "ken@example.com")]
ITEMS = [("Walnut desk, 160 x 80 cm", "WD-160-80", 34_900),
         ("Ergonomic chair, graphite", "EC-GR-02", 28_900),
         ("Bookshelf, oak, 5 shelves", "BO-5-OAK", 21_900),
         ("Monitor arm, dual", "MA-D-01", 8_900), ("Desk lamp, brass", "DL-BR-01", 6_900),
         ("Standing mat, 90 x 60 cm", "SM-90-60", 4_900)]
CHEAP = [i for i in ITEMS if i[2] <= REFUND_LIMIT_CENTS]
DEAR = [i for i in ITEMS if i[2] > REFUND_LIMIT_CENTS]
REASONS = ["Arrived damaged: the left leg was split along the grain.",
           "Wrong colour delivered (ordered graphite, received beige).",
           "The customer changed their mind within the 30-day window.",
           "Parcel lost in transit according to the carrier's tracking.",
           "Duplicate order placed by mistake; the customer kept the first one."]
LANGUAGES = {"en": "Hello", "fr": "Bonjour", "de": "Hallo"}
LLM_ERRORS = ["LLM HTTP 400: context_length_exceeded: this model's maximum context length is "
              "128000 tokens", "LLM HTTP 401: invalid_api_key: Incorrect API key provided",
              "ReadTimeout: the LLM did not answer within 60 s"]


# -- writing rows ---------------------------------------------------------------------------

def _default(field: Any) -> Any:
    """A column's value when a row leaves it out, as the database stores it."""
    if field.primary_key:
        return None
    value = field.get_default()
    if isinstance(field, JSONField):
        return None if value is None else dumps(value)
    if isinstance(field, BooleanField):
        return int(bool(value))
    if isinstance(field, DecimalField):
        return str(value)
    return value


class Table:
    """A model's INSERT, as ``scale._builder`` makes it: its concrete columns in order, the
    field's default for a column a row leaves out, explicit ids; rows are dicts of attnames
    holding what the column stores."""

    def __init__(self, model: type[Model]) -> None:
        fields = model._meta.concrete_fields
        self.name = model._meta.db_table
        self.columns = [f.column for f in fields]
        self.keys = [f.attname for f in fields]
        self.defaults = [_default(f) for f in fields]

    def row(self, values: dict[str, Any]) -> tuple:
        return tuple([values.get(k, d) for k, d in zip(self.keys, self.defaults, strict=True)])


class SqliteLoader:
    """Big transactions of ``executemany`` on a plain sqlite3 connection to the bench file."""

    engine = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA cache_size=-262144")  # 256 MiB for this connection

    @staticmethod
    def dt(value: datetime | None) -> str | None:
        """As Django's SQLite backend stores it: naive UTC text (every value here is UTC)."""
        return None if value is None else str(value.replace(tzinfo=None))

    def write(self, rows: dict[Table, list[tuple]]) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        for table, batch in rows.items():
            if batch:
                cols = ", ".join(f'"{c}"' for c in table.columns)
                marks = ", ".join("?" * len(table.columns))
                self.conn.executemany(f'INSERT INTO "{table.name}" ({cols}) VALUES ({marks})',
                                      batch)
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.conn.close()

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*"))


class PostgresLoader:
    """``COPY`` on a psycopg connection to the bench database; afterwards the sequences are
    moved past the explicit ids and the tables analyzed (autovacuum would have by then)."""

    engine = "postgresql"

    def __init__(self, url: str) -> None:
        import psycopg

        self.path = url.rsplit("/", 1)[-1]
        self.conn = psycopg.connect(url)
        self.bytes = 0

    @staticmethod
    def dt(value: datetime | None) -> str | None:
        return None if value is None else value.isoformat(" ")

    def write(self, rows: dict[Table, list[tuple]]) -> None:
        with self.conn.cursor() as cur:
            for table, batch in rows.items():
                if batch:
                    cols = ", ".join(f'"{c}"' for c in table.columns)
                    with cur.copy(f'COPY "{table.name}" ({cols}) FROM STDIN') as copy:
                        for row in batch:
                            copy.write_row(row)
        self.conn.commit()

    def close(self) -> None:
        with self.conn.cursor() as cur:
            for model in (Run, Step, Approval, Event, Worker):
                table = model._meta.db_table
                cur.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                            f'(SELECT COALESCE(MAX(id), 1) FROM "{table}"))')
        self.conn.commit()
        self.conn.autocommit = True
        self.conn.execute("ANALYZE")
        self.bytes = self.conn.execute("SELECT pg_database_size(current_database())") \
            .fetchone()[0]
        self.conn.close()

    def size_bytes(self) -> int:
        return self.bytes


# -- the runs -------------------------------------------------------------------------------

class Owners:
    """The lease owners seen in the audit log: a few live workers (with rows in the workers
    table), a few dead ones that still have rows, a couple of dozen recent ones and ~200 long
    gone; each was the owner of the runs of its own stretch of time."""

    def __init__(self, rng: random.Random) -> None:
        def owner(host: str) -> str:
            return f"worker@{host}:{rng.randint(2_000, 4_000_000)}:{rng.getrandbits(32):08x}"

        hosts = [f"worker-{n:02d}" for n in range(1, 9)]
        self.dead = [owner(hosts[n % 8]) for n in range(200)]
        self.recent = [owner(hosts[n % 8]) for n in range(20)]
        self.live = [owner(hosts[n]) for n in range(4)]
        self.dead_rows = self.recent[-3:]  # died lately: their rows are still there
        self.hosts = hosts

    def at(self, rng: random.Random, frac: float) -> str:
        """Who ran a run created at ``frac`` of the timeline (0 oldest, 1 newest)."""
        if frac < 0.85:
            pool, pos = self.dead, frac / 0.85
        else:
            pool, pos = self.recent[:-3] + self.live, (frac - 0.85) / 0.15
        i = min(len(pool) - 1, max(0, int(pos * len(pool)) + rng.randint(-2, 1)))
        return pool[i]

    def all(self) -> list[str]:
        return self.dead + self.recent + self.live


class Story:
    """One run as the runtime writes it: the row, its steps, its approvals and its events,
    committed in groups (one time and one actor per commit, as a plan is committed)."""

    def __init__(self, b: Builder, run_id: int, agent: str, created: datetime, creator: str,
                 data: Any) -> None:
        self.b, self.id, self.agent, self.rng = b, run_id, agent, b.rng
        self.t = self.created = created
        self.creator, self.input = creator, data
        self.commits: list[tuple[datetime, str, list[EventSpec]]] = []
        self.steps: list[dict[str, Any]] = []
        self.approvals: list[dict[str, Any]] = []
        self.epoch, self.owner, self.started = 0, "", False
        self.llm_requests = self.tokens_in = self.tokens_out = 0
        self.cost = Decimal(0)
        self.row: dict[str, Any] = {"status": "queued"}
        self.commit(creator, ("run.created", {"agent": agent, "input": data,
                                               "created_by": creator}, None))

    # time and commits
    def later(self, lo: float, hi: float) -> None:
        self.t += timedelta(seconds=self.rng.uniform(lo, hi))

    def commit(self, actor: str, *events: tuple[str, Any, int | None]) -> None:
        self.commits.append((self.t, actor, [EventSpec(k, p, i) for k, p, i in events]))

    # leases
    def take(self, owner: str) -> None:
        self.later(0.05, 2.0)
        self.epoch += 1
        self.owner = owner
        self.commit(owner, ("lease.taken", {"owner": owner, "epoch": self.epoch,
                                            "lease_seconds": LEASE}, None),
                    ("run.resumed" if self.started else "run.started", {"owner": owner}, None))
        self.started = True
        self.row["status"] = "running"

    def take_over(self, owner: str, step: dict[str, Any]) -> None:
        """The owner died mid-call; after its lease expired another took the run over."""
        previous, expired = self.owner, self.t + timedelta(seconds=LEASE)
        self.t = expired + timedelta(seconds=self.rng.uniform(0.2, 4.0))
        self.epoch += 1
        self.owner = owner
        step["status"] = "interrupted"
        self.commit(owner, ("lease.taken_over", {
            "owner": owner, "epoch": self.epoch, "lease_seconds": LEASE,
            "previous_owner": previous, "previous_epoch": self.epoch - 1,
            "previous_expires_at": expired.isoformat(timespec="microseconds"),
            "reason": "lease expired"}, None),
            ("run.resumed", {"owner": owner, "after": "takeover"}, None),
            ("step.interrupted", {
                "was": "executing", "tool": step["tool"], "effect": step["effect"],
                "attempt": step["attempt"], "previous_owner": previous,
                "dispatched": step["dispatched_attempt"] == step["attempt"]}, step["index"]))

    def released(self, status: str) -> tuple[str, Any, None]:
        event = ("lease.released", {"owner": self.owner, "epoch": self.epoch}, None)
        self.row["status"] = status
        self.owner = ""
        return event

    # steps
    def start_step(self) -> dict[str, Any]:
        """``step.started`` and ``llm.requested``, one commit."""
        index = len(self.steps) + 1
        key = f"run{self.id}-step{index}-{self.rng.getrandbits(48):012x}"
        self.later(0.01, 0.4)
        step = {"index": index, "status": "deciding", "tool": "", "arguments": None,
                "effect": "", "idempotency_key": key, "result": None, "error": "", "attempt": 0,
                "dispatches": False, "dispatched_attempt": None, "started_at": self.t,
                "finished_at": None}
        self.steps.append(step)
        self.llm_requests += 1
        self.commit(self.owner, ("step.started", {"idempotency_key": key}, index),
                    ("llm.requested", {"request": self.llm_requests}, index))
        return step

    def _responded(self, step: dict[str, Any]) -> tuple[str, Any, int]:
        self.later(0.4, 3.5)
        tokens_in = 900 + 350 * step["index"] + self.rng.randint(0, 400)
        tokens_out = self.rng.randint(30, 220)
        cost = (Decimal(tokens_in * 150 + tokens_out * 600) / 1_000_000_000).quantize(
            Decimal("0.000001"))
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.cost += cost
        return ("llm.responded", {"tokens_in": tokens_in, "tokens_out": tokens_out,
                                  "cost": str(cost), "decisions": 1}, step["index"])

    def decide(self, step: dict[str, Any], tool: str, arguments: Any, effect: str,
               *more: tuple[str, Any, int | None]) -> None:
        """``llm.responded`` and ``step.decided`` (and what follows in the same commit)."""
        step.update(tool=tool, arguments=arguments, effect=effect)
        self.commit(self.owner, self._responded(step), ("step.decided", {
            "tool": tool, "arguments": arguments, "effect": effect,
            "idempotency_key": step["idempotency_key"]}, step["index"]), *more)

    def start_tool(self, step: dict[str, Any], dispatches: bool = False,
                   approval: dict[str, Any] | None = None, decided: bool = False) -> None:
        """``step.tool_started`` (after ``approval.consumed`` when a person approved it); in
        the commit of ``step.decided`` unless ``decided`` is False."""
        step["attempt"] += 1
        step.update(status="executing", dispatches=dispatches)
        events: list[tuple[str, Any, int | None]] = []
        if approval is not None:
            events.append(("approval.consumed", {"approval_id": approval["id"],
                                                 "kind": approval["kind"],
                                                 "decided_by": approval["decided_by"]},
                           step["index"]))
            approval.update(status="consumed", consumed_at=self.t)
        events.append(("step.tool_started", {"tool": step["tool"], "effect": step["effect"],
                                             "attempt": step["attempt"],
                                             "dispatches": dispatches}, step["index"]))
        if decided:
            self.commits[-1][2].extend(EventSpec(k, p, i) for k, p, i in events)
        else:
            self.later(0.01, 0.2)
            self.commit(self.owner, *events)
        if dispatches:
            self.later(0.001, 0.02)
            step["dispatched_attempt"] = step["attempt"]
            self.commit(self.owner, ("step.tool_dispatched", {"attempt": step["attempt"]},
                                     step["index"]))

    def finish_tool(self, step: dict[str, Any], result: Any) -> None:
        self.later(0.02, 1.5)
        step.update(status="succeeded", result=result, finished_at=self.t)
        self.commit(self.owner, ("step.tool_finished", {"attempt": step["attempt"],
                                                        "result": result}, step["index"]))

    def tool_step(self, tool: str, arguments: Any, effect: str, result: Any,
                  dispatches: bool = False) -> dict[str, Any]:
        step = self.start_step()
        self.decide(step, tool, arguments, effect)
        self.start_tool(step, dispatches, decided=True)
        self.finish_tool(step, result)
        return step

    def succeed(self, output: Any) -> None:
        """The final answer: a step deciding it, the run succeeded, the lease released."""
        step = self.start_step()
        self.later(0.4, 3.0)
        step.update(status="succeeded", result=output, finished_at=self.t)
        self.commit(self.owner, self._responded(step),
                    ("step.decided", {"final": True, "output": output}, step["index"]),
                    ("run.succeeded", {"output": output}, None), self.released("succeeded"))
        self.row["output"] = output

    def fail_llm(self) -> None:
        step = self.start_step()
        self.later(0.5, 60)
        message = self.rng.choice(LLM_ERRORS)
        step.update(status="failed", error=message, finished_at=self.t)
        self.row.update(failure_code="error", failure_message=f"LLM request failed: {message}")
        self.commit(self.owner, ("llm.failed", {"error": message, "attempt": 1,
                                                "retryable": False}, step["index"]),
                    ("run.failed", {"code": "error",
                                    "message": f"LLM request failed: {message}"}, None),
                    self.released("failed"))

    # approvals
    def pause(self, step: dict[str, Any], kind: str, title: str, detail: str) -> dict[str, Any]:
        """The request put to a person: ``approval.requested``, the run waiting."""
        if kind == "policy":
            self.later(0.001, 0.05)
        digest = request_digest(step["tool"], step["arguments"], step["effect"])
        approval = {"id": self.b.next_approval(), "step": step, "kind": kind,
                    "status": "pending", "tool": step["tool"], "arguments": step["arguments"],
                    "effect": step["effect"], "digest": digest, "title": title[:300],
                    "detail": detail, "created_at": self.t, "decided_by": "",
                    "decided_at": None, "note": "", "result": None, "consumed_at": None}
        self.approvals.append(approval)
        step["status"] = "waiting" if kind == "policy" else "interrupted"
        self.commit(self.owner, ("approval.requested", {
            "kind": kind, "title": approval["title"], "tool": step["tool"],
            "arguments": step["arguments"], "effect": step["effect"], "digest": digest,
            "attempt": step["attempt"], "idempotency_key": step["idempotency_key"],
            "approval_id": approval["id"]}, step["index"]),
            ("run.paused", {"reason": kind}, step["index"]), self.released("waiting"))
        return approval

    def decide_approval(self, approval: dict[str, Any], status: str, note: str = "",
                        result: Any = None, within: tuple[float, float] = (30, 7_200)) -> str:
        """A person decides, some time later (before now); returns who."""
        room = max(1.0, (self.b.now - self.t).total_seconds() * 0.3)
        self.t += timedelta(seconds=min(self.rng.uniform(*within), room))
        by = self.rng.choice([u for u in USERS[:5] if u != self.creator])
        approval.update(status=status, decided_by=by, decided_at=self.t, note=note)
        step = approval["step"]
        base = {"approval_id": approval["id"], "kind": approval["kind"], "decided_by": by,
                "note": note}
        if status == "approved":
            self.commit(by, ("approval.granted", base, step["index"]))
            self.row["status"] = "queued"
        elif status == "resolved":
            approval["result"] = result
            step.update(status="succeeded", result=result, finished_at=self.t)
            self.commit(by, ("approval.resolved", {**base, "result": result}, step["index"]),
                        ("step.tool_finished", {"result": result, "attempt": step["attempt"],
                                                "recovered_by": by}, step["index"]))
            self.row["status"] = "queued"
        elif status == "rejected":
            message = f"rejected by {by}: {note}"
            step.update(status="rejected", finished_at=self.t)
            self.row.update(status="failed", failure_code="rejected", failure_message=message)
            self.commit(by, ("approval.rejected", base, step["index"]),
                        ("run.failed", {"code": "rejected", "message": message}, None))
        return by

    def cancel(self, reason: str) -> None:
        room = max(1.0, (self.b.now - self.t).total_seconds() * 0.3)
        self.t += timedelta(seconds=min(self.rng.uniform(60, 3_600), room))
        by = self.rng.choice(USERS[:5])
        events: list[tuple[str, Any, int | None]] = []
        for a in self.approvals:
            if a["status"] == "pending":
                a.update(status="cancelled", decided_by=by, decided_at=self.t, note=reason)
                events.append(("approval.cancelled", {"approval_id": a["id"],
                                                      "reason": "run cancelled"},
                               a["step"]["index"]))
        events.append(("run.cancelled", {"by": by, "reason": reason}, None))
        self.commit(by, *events)
        self.row["status"] = "cancelled"


class Builder:
    """Plans the runs (what each did, within the totals asked), then writes them in order."""

    def __init__(self, loader: Any, sizes: Sizes, now: datetime) -> None:
        self.loader, self.sizes, self.now = loader, sizes, now
        self.rng = random.Random(SEED)
        self.owners = Owners(self.rng)
        self.tables = {m: Table(m) for m in (Run, Step, Approval, Event, Worker)}
        self._approval_id = 0
        self.counts: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        self.actors: set[str] = set()
        self.payload_bytes = 0
        self.ids: dict[str, Any] = {}
        self.held: Counter[str] = Counter()
        self._counts: dict[tuple, int] = {}

    def next_approval(self) -> int:
        self._approval_id += 1
        return self._approval_id

    # -- the plan: one shape per run -----------------------------------------------------

    def plan(self) -> list[tuple]:
        """A shape per run id (1..runs): (story, agent, tool steps, in-flight events), its
        event count fixed by the shape; the totals asked are met exactly, or this says why
        they cannot be."""
        s, rng = self.sizes, random.Random(SEED + 1)
        n = s.runs
        if s.pending + 100 > n:
            raise ValueError(f"{s.pending:,} pending approvals need more than {n:,} runs")
        per_run = SPAN.total_seconds() / n
        self.long_id = max(1, n - math.ceil(_long_duration(s.long_steps).total_seconds()
                                            / per_run) - 1)
        others = [i for i in range(1, n + 1) if i != self.long_id]
        live = max(5, min(24, n // 400))
        dead = max(2, min(6, n // 1_000))
        queued = max(5, int(n * SHARES["queued"]))
        newest = others[-(live + dead + queued):]  # the newest runs: not claimed or running
        older = others[:-(live + dead + queued)]
        shapes: dict[int, tuple] = {self.long_id: ("long", "refund-desk", s.long_steps, 0)}
        for i, run_id in enumerate(newest):
            if i < live + dead:
                agent = rng.choice(["refund-desk", "hello", "bench_read"])
                story = "running" if i < live else "running_dead"
                shapes[run_id] = (story, agent, rng.randint(0, 1), rng.choice([2, 5]))
            else:
                requeued = i % 10 == 5
                agent = "bench_approve" if requeued else rng.choice(list(PLAIN_AGENTS))
                shapes[run_id] = ("requeued" if requeued else "queued", agent, 0, 0)
        rng.shuffle(older)
        pos = 0

        def take(count: int) -> list[int]:
            nonlocal pos
            pos += count
            return older[pos - count:pos]

        for run_id in take(s.pending):
            if rng.random() < INTERRUPTED:
                shapes[run_id] = ("pending_interrupted",
                                  rng.choice(["refund-desk", "refund-desk", "hello"]), 0, 0)
            else:
                shapes[run_id] = ("pending_policy",
                                  rng.choice(["refund-desk", "bench_approve", "bench_approve",
                                              "bench_approve"]), 0, 0)
        for run_id in take(int(n * SHARES["cancelled"])):
            waiting = rng.random() < 0.2
            shapes[run_id] = ("cancelled_waiting" if waiting else "cancelled_queued",
                              "bench_approve" if waiting else rng.choice(list(PLAIN_AGENTS)),
                              0, 0)
        for run_id in take(int(n * SHARES["failed"])):
            if rng.random() < 0.3:
                shapes[run_id] = ("rejected", rng.choice(["refund-desk", "bench_approve"]), 0,
                                  0)
            else:
                shapes[run_id] = ("failed_llm", rng.choice(list(PLAIN_AGENTS)), 0, 0)
        for run_id in take(int(n * SHARES["approved"])):
            shapes[run_id] = ("approved", rng.choice(["refund-desk", "bench_approve"]), 0, 0)
        for run_id in take(max(1, int(n * SHARES["resolved"]))):
            shapes[run_id] = ("resolved", rng.choice(["refund-desk", "hello"]), 0, 0)
        agents, weights = list(PLAIN_AGENTS), list(PLAIN_AGENTS.values())
        plain = older[pos:]
        for run_id in plain:
            shapes[run_id] = ("plain", rng.choices(agents, weights)[0], 0, 0)
        self._fit(shapes, plain, rng)
        return [shapes[i] for i in range(1, n + 1)]

    def _fit(self, shapes: dict[int, tuple], plain: list[int], rng: random.Random) -> None:
        """Give finished runs tool steps until the events total is met exactly: first the
        steps their agents naturally take, while the budget allows, then an exact remainder
        (a refund, 13 events, and reads, 6 each: 13 = 1 mod 6 makes any total past 65)."""
        budget = self.sizes.events - sum(self.count(sh) for sh in shapes.values())
        if budget < 0:
            raise ValueError(f"{self.sizes.events:,} events are fewer than these runs make "
                             f"at the least ({self.sizes.events - budget:,})")
        order = plain[:]
        rng.shuffle(order)
        for run_id in order:
            story, agent, k, j = shapes[run_id]
            want = NATURAL_STEPS[agent] if agent in ("refund-desk", "hello") else \
                rng.randint(1, NATURAL_STEPS[agent]) if NATURAL_STEPS[agent] else 0
            cost = self.count((story, agent, want, j)) - self.count(shapes[run_id])
            if want and budget - cost >= 80:
                shapes[run_id] = (story, agent, want, j)
                budget -= cost
        bare_refunds = [r for r in order if shapes[r][1] == "refund-desk" and shapes[r][2] == 0]
        for run_id in bare_refunds[:budget % 6]:
            shapes[run_id] = ("plain", "refund-desk", 2, 0)
            budget -= 13
        for run_id in order:
            story, agent, k, j = shapes[run_id]
            while budget >= 6 and agent in ("bench_read", "bench_write") and k < MAX_EXTRA:
                k += 1
                budget -= 6
            shapes[run_id] = (story, agent, k, j)
        if budget != 0:
            raise ValueError(f"{self.sizes.events:,} events: {budget:,} more than "
                             f"{self.sizes.runs:,} runs of these shapes can hold")

    def count(self, shape: tuple) -> int:
        """Events a run of this shape writes (every run of a shape writes as many)."""
        if shape not in self._counts:
            keep = (self.rng, self._approval_id)
            self.rng = random.Random(0)
            try:
                story = self.story(1, shape, 0.5)
                self._counts[shape] = sum(len(c[2]) for c in story.commits)
            finally:
                self.rng, self._approval_id = keep
        return self._counts[shape]

    # -- the stories -----------------------------------------------------------------------

    def story(self, run_id: int, shape: tuple, frac: float) -> Story:
        kind, agent, k, j = shape
        rng = self.rng
        created = self.now - SPAN * (1 - frac) - timedelta(seconds=90)
        if kind == "long":
            created = self.now - _long_duration(k)
        elif kind == "running_dead":  # its worker died 10 minutes ago, mid-run
            created = self.now - timedelta(minutes=11)
        creator = rng.choice(USERS)
        order = self._order(rng, dear=kind in POLICY_STORIES)
        data: Any = {}
        if agent == "refund-desk":
            data = {"order_id": order["order_id"], "reason": rng.choice(REASONS)}
            if kind == "long":
                data = {"batch": "returns-2026-11", "orders": k // 2,
                        "instructions": "Refund every approved return in the batch; mail "
                                        "nobody, the shop's nightly mailer does that."}
        elif agent == "hello":
            name = rng.choice(CUSTOMERS)[0].split()[0]
            data = {"name": name, "language": rng.choice(list(LANGUAGES))}
        elif agent in ("bench_read", "bench_write"):
            data = {"steps": k}
        st = Story(self, run_id, agent, created, creator, data)
        getattr(self, f"_{kind}")(st, agent, k, j, order, frac)
        return st

    @staticmethod
    def _order(rng: random.Random, dear: bool = False) -> dict[str, Any]:
        """An order as ``lookup_order`` returns it; ``dear`` ones need a person's approval
        to be refunded (refund-desk's policy), the others do not."""
        item, sku, cents = rng.choice(DEAR if dear else CHEAP)
        customer, email = rng.choice(CUSTOMERS)
        order_id = rng.randint(10_000, 99_999)
        placed = datetime(2026, 10, 1, tzinfo=UTC) + timedelta(minutes=rng.randint(0, 60_000))
        return {"order_id": order_id, "customer": customer, "email": email, "item": item,
                "amount_cents": cents, "currency": "EUR", "status": "delivered",
                "placed_at": placed.isoformat(timespec="seconds"),
                "lines": [{"sku": sku, "description": item, "qty": 1, "unit_cents": cents}],
                "shipping": {"carrier": rng.choice(["DHL", "UPS", "GLS"]),
                             "tracking": f"JD{rng.getrandbits(60):018d}",
                             "delivered_at": (placed + timedelta(days=3)).isoformat(
                                 timespec="seconds")}}

    def _read(self, st: Story, agent: str, n: int, order: dict[str, Any]) -> dict[str, Any]:
        """The agent's read-only tool, once."""
        if agent == "refund-desk":
            return st.tool_step("lookup_order", {"order_id": order["order_id"]}, "read_only",
                                order)
        if agent == "hello":
            lang = st.input["language"]
            return st.tool_step("look_up_greeting", {"language": lang}, "read_only",
                                LANGUAGES[lang])
        return st.tool_step("bench_read", {"n": n}, "read_only", {"n": n})

    def _write_request(self, st: Story, agent: str, order: dict[str, Any],
                       n: int = 1) -> tuple[str, dict[str, Any], bool]:
        """(tool, arguments, dispatches) of the agent's side effect."""
        if agent == "refund-desk":
            return "issue_refund", {"order_id": order["order_id"],
                                    "amount_cents": order["amount_cents"]}, True
        if agent == "hello":
            return "send_greeting", {"name": st.input["name"],
                                     "greeting": LANGUAGES[st.input["language"]]}, False
        return "bench_write", {"n": n}, False

    def _write_result(self, st: Story, agent: str, order: dict[str, Any],
                      step: dict[str, Any]) -> Any:
        key = step["idempotency_key"]
        if agent == "refund-desk":
            return {"refund_id": f"re_{self.rng.getrandbits(96):024x}", "status": "succeeded",
                    "amount_cents": order["amount_cents"], "currency": "EUR", "key": key}
        if agent == "hello":
            return {"sent": f"{step['arguments']['greeting']}, {st.input['name']}!",
                    "key": key}
        return {"n": step["arguments"]["n"]}

    def _policy_title(self, agent: str, arguments: dict[str, Any]) -> tuple[str, str]:
        if agent == "refund-desk":
            return (f"Refund {arguments['amount_cents'] / 100:.2f} on order "
                    f"{arguments['order_id']}?", f"Refunds above {REFUND_LIMIT_CENTS / 100:.2f}"
                    " need a person's approval.")
        return "bench: approve a no-op write", f"n={arguments.get('n')}"

    def _to_policy(self, st: Story, agent: str, order: dict[str, Any]) -> dict[str, Any]:
        """Up to the policy's pause: the reads before, the side effect decided and put to a
        person."""
        st.take(self.owners.at(self.rng, self._frac(st)))
        if agent == "refund-desk":
            self._read(st, agent, 1, order)
        step = st.start_step()
        tool, arguments, _ = self._write_request(st, agent, order)
        st.decide(step, tool, arguments, "side_effect")
        title, detail = self._policy_title(agent, arguments)
        return st.pause(step, "policy", title, detail)

    def _to_interrupted(self, st: Story, agent: str, order: dict[str, Any]) -> dict[str, Any]:
        """Up to a side effect's interruption put to a person: the call started (and was
        dispatched), its worker died, another took the run over."""
        first = self.owners.at(self.rng, self._frac(st))
        st.take(first)
        self._read(st, agent, 1, order)
        step = st.start_step()
        tool, arguments, dispatches = self._write_request(st, agent, order)
        st.decide(step, tool, arguments, "side_effect")
        st.start_tool(step, dispatches, decided=True)
        started, who = st.t, st.owner
        st.take_over(self.rng.choice([o for o in self.owners.recent if o != first]), step)
        title = f"{tool} was interrupted: did it take effect?"
        detail = (f"The call to {tool} (side_effect) started at "
                  f"{started.isoformat(timespec='seconds')}, attempt {step['attempt']}, run "
                  f"by {who}, and the process stopped before its outcome was recorded, so "
                  "whether it took effect is unknown. Check the outside world for its "
                  "idempotency key.")
        return st.pause(step, "interrupted_side_effect", title, detail)

    def _frac(self, st: Story) -> float:
        return st.id / self.sizes.runs

    def _output(self, st: Story, agent: str, k: int, order: dict[str, Any]) -> Any:
        if agent == "refund-desk":
            if k >= 2:
                return {"order_id": order["order_id"], "refunded": order["amount_cents"]}
            why = ("The order was never delivered; the carrier's report comes first." if k else
                   f"Order {order['order_id']} is outside the 30-day return window.")
            return {"order_id": order["order_id"], "refunded": False, "why": why}
        if agent == "hello":
            greeting = LANGUAGES[st.input["language"]]
            return {"sent": f"{greeting}, {st.input['name']}!"} if k >= 2 else \
                f"{greeting}, {st.input['name']}!"
        if agent == "bench_final":
            return "done"
        return {"steps": k}

    # story kinds: each _<kind>(story, agent, tool steps, in-flight events, order, frac)
    def _plain(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float) -> None:
        st.take(self.owners.at(self.rng, frac))
        if agent in ("refund-desk", "hello"):
            if k >= 1:
                self._read(st, agent, 1, order)
            if k >= 2:
                tool, arguments, dispatches = self._write_request(st, agent, order)
                step = st.start_step()
                st.decide(step, tool, arguments, "side_effect")
                st.start_tool(step, dispatches, decided=True)
                st.finish_tool(step, self._write_result(st, agent, order, step))
        else:
            for n in range(1, k + 1):
                if agent == "bench_write":
                    step = st.start_step()
                    st.decide(step, "bench_write", {"n": n}, "side_effect")
                    st.start_tool(step, decided=True)
                    st.finish_tool(step, {"n": n})
                else:
                    self._read(st, agent, n, order)
        st.succeed(self._output(st, agent, k, order))

    def _queued(self, st: Story, *args: Any) -> None:
        st.row["status"] = "queued"

    def _requeued(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float
                  ) -> None:
        approval = self._to_policy(st, agent, order)
        st.decide_approval(approval, "approved", "ok")

    def _running(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float,
                 owner: str | None = None) -> None:
        st.take(owner or self.rng.choice(self.owners.live))
        for n in range(1, k + 1):
            self._read(st, agent, n, order)
        step = st.start_step()
        if j >= 5:
            tool = {"refund-desk": "lookup_order", "hello": "look_up_greeting"}.get(
                agent, "bench_read")
            arguments = {"order_id": order["order_id"]} if agent == "refund-desk" else \
                {"language": st.input["language"]} if agent == "hello" else {"n": k + 1}
            st.decide(step, tool, arguments, "read_only")
            st.start_tool(step, decided=True)
        expires = st.t + timedelta(seconds=LEASE)
        st.row.update(lease_owner=st.owner, lease_expires_at=expires)

    def _running_dead(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float
                      ) -> None:
        owner = self.owners.dead_rows[st.id % len(self.owners.dead_rows)]
        self._running(st, agent, k, j, order, frac, owner)

    def _pending_policy(self, st: Story, agent: str, k: int, j: int, order: dict,
                        frac: float) -> None:
        self._to_policy(st, agent, order)

    def _pending_interrupted(self, st: Story, agent: str, k: int, j: int, order: dict,
                             frac: float) -> None:
        self._to_interrupted(st, agent, order)

    def _cancelled_queued(self, st: Story, *args: Any) -> None:
        st.cancel("Created by mistake.")

    def _cancelled_waiting(self, st: Story, agent: str, k: int, j: int, order: dict,
                           frac: float) -> None:
        self._to_policy(st, agent, order)
        st.cancel("Not needed any more: handled by hand.")

    def _failed_llm(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float
                    ) -> None:
        st.take(self.owners.at(self.rng, frac))
        st.fail_llm()

    def _rejected(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float
                  ) -> None:
        approval = self._to_policy(st, agent, order)
        st.decide_approval(approval, "rejected", "Not eligible: past the return window.")

    def _approved(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float
                  ) -> None:
        approval = self._to_policy(st, agent, order)
        st.decide_approval(approval, "approved", "Checked the photos: approved.")
        st.take(self.owners.at(self.rng, frac))
        step = approval["step"]
        st.start_tool(step, agent == "refund-desk", approval)
        st.finish_tool(step, self._write_result(st, agent, order, step))
        st.succeed(self._output(st, agent, 2 if agent == "refund-desk" else 1, order))

    def _resolved(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float
                  ) -> None:
        approval = self._to_interrupted(st, agent, order)
        step = approval["step"]
        st.decide_approval(approval, "resolved", "The provider's dashboard shows it went out.",
                           self._write_result(st, agent, order, step))
        st.take(self.owners.at(self.rng, frac))
        st.succeed(self._output(st, agent, 2, order))

    def _long(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float) -> None:
        """A batch of refunds: lookups and refunds in turn, every 50th refund approved by a
        person first, one interrupted mid-call and resolved; the last step in flight."""
        rng = self.rng
        live = self.owners.live[0]
        st.take(self.owners.recent[0])
        interrupted_at = (k * 2 // 5) // 2 * 2 + 2
        for index in range(1, k):
            if index % 2:
                order = self._order(rng, dear=(index + 1) % 100 == 0)
                step = st.start_step()
                st.decide(step, "lookup_order", {"order_id": order["order_id"]}, "read_only")
                st.start_tool(step, decided=True)
                st.finish_tool(step, order)
                continue
            step = st.start_step()
            arguments = {"order_id": order["order_id"], "amount_cents": order["amount_cents"]}
            st.decide(step, "issue_refund", arguments, "side_effect")
            if index % 100 == 0:
                title, detail = self._policy_title("refund-desk", arguments)
                approval = st.pause(step, "policy", title, detail)
                st.decide_approval(approval, "approved", "Within the batch's budget.",
                                   within=(5, 40))
                st.take(live if index > interrupted_at else self.owners.recent[0])
                st.start_tool(step, True, approval)
            elif index == interrupted_at:
                st.start_tool(step, True, decided=True)
                st.take_over(live, step)
                title = "issue_refund was interrupted: did it take effect?"
                approval = st.pause(step, "interrupted_side_effect", title,
                                    "The process stopped before its outcome was recorded.")
                st.decide_approval(approval, "resolved", "Found it in the provider's log.",
                                   self._write_result(st, agent, order, step), within=(5, 40))
                st.take(live)
                continue
            else:
                st.start_tool(step, True, decided=True)
            st.finish_tool(step, self._write_result(st, agent, order, step))
        step = st.start_step()  # the step in flight: a lookup, started
        st.decide(step, "lookup_order", {"order_id": order["order_id"] + 1}, "read_only")
        st.start_tool(step, decided=True)
        st.row.update(lease_owner=st.owner, lease_expires_at=st.t + timedelta(seconds=LEASE))

    # -- writing ---------------------------------------------------------------------------

    def build(self, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Plan, then write every run in id order, many runs per transaction."""
        shapes = self.plan()
        self._approval_id = 0
        self.rng = random.Random(SEED + 2)
        dt = self.loader.dt
        step_id = event_id = 0
        t_run, t_step, t_approval, t_event = (self.tables[m] for m in (Run, Step, Approval,
                                                                       Event))
        chunk = 2_000
        for lo in range(0, len(shapes), chunk):
            rows: dict[Table, list[tuple]] = {t_run: [], t_step: [], t_approval: [],
                                              t_event: []}
            for run_id in range(lo + 1, min(lo + chunk, len(shapes)) + 1):
                shape = shapes[run_id - 1]
                st = self.story(run_id, shape, run_id / len(shapes))
                seq, head = 0, ""
                for at, actor, specs in st.commits:
                    built, seq, head = build_events(run_id, seq, head, specs, actor, at)
                    at_db = dt(at)
                    for e in built:
                        event_id += 1
                        rows[t_event].append(t_event.row({
                            "id": event_id, "run_id": run_id, "step_index": e.step_index,
                            "seq": e.seq, "kind": e.kind, "payload": e.payload_text,
                            "actor": e.actor, "at": at_db, "hash": e.hash}))
                        self.kinds[e.kind] += 1
                        self.payload_bytes += len(e.payload_text)
                    self.actors.add(actor)
                for s in st.steps:
                    step_id += 1
                    s["id"] = step_id
                    rows[t_step].append(t_step.row({
                        **s, "run_id": run_id, "arguments": _json(s["arguments"]),
                        "result": _json(s["result"]), "dispatches": int(s["dispatches"]),
                        "started_at": dt(s["started_at"]), "finished_at": dt(s["finished_at"])}))
                for a in st.approvals:
                    rows[t_approval].append(t_approval.row({
                        **a, "run_id": run_id, "step_id": a["step"]["id"],
                        "arguments": dumps(a["arguments"]), "result": _json(a["result"]),
                        "created_at": dt(a["created_at"]), "decided_at": dt(a["decided_at"]),
                        "consumed_at": dt(a["consumed_at"])}))
                    self.counts[f"approvals {a['kind']} {a['status']}"] += 1
                    self._note_approval(st, shape, a)
                r = st.row
                rows[t_run].append(t_run.row({
                    **r, "id": run_id, "agent": st.agent, "input": dumps(st.input),
                    "output": _json(r.get("output")), "lease_epoch": st.epoch,
                    "lease_expires_at": dt(r.get("lease_expires_at")), "event_seq": seq,
                    "event_hash": head, "llm_requests": st.llm_requests,
                    "tokens_in": st.tokens_in, "tokens_out": st.tokens_out,
                    "cost": str(st.cost), "created_by": st.creator,
                    "created_at": dt(st.created), "updated_at": dt(st.commits[-1][0])}))
                self.counts[f"runs {r['status']}"] += 1
                if r.get("lease_owner"):
                    self.held[r["lease_owner"]] += 1
                self._note_run(st, shape, seq)
            self.loader.write(rows)
            if progress is not None and (lo // chunk) % 10 == 9:
                progress(f"{min(lo + chunk, len(shapes)):,} runs, {event_id:,} events")
        self.loader.write({self.tables[Worker]: self._workers()})
        self.counts["runs"] = len(shapes)
        self.counts["events"] = event_id
        self.counts["steps"] = step_id
        self.counts["approvals"] = self._approval_id
        return self.summary()

    def _note_run(self, st: Story, shape: tuple, events: int) -> None:
        kind, agent = shape[0], shape[1]
        if kind == "long":
            self.ids.update(long_run=st.id, long_run_steps=len(st.steps),
                            long_run_events=events)
        elif kind == "plain" and agent == "refund-desk" and shape[2] == 2 and (
                "short_run" not in self.ids or self.ids["short_run"] < self.sizes.runs // 2):
            self.ids.update(short_run=st.id, short_run_steps=len(st.steps),
                            short_run_events=events)

    def _note_approval(self, st: Story, shape: tuple, a: dict[str, Any]) -> None:
        if a["status"] == "pending" and a["kind"] == "interrupted_side_effect" and \
                shape[1] == "refund-desk" and "pending_interrupted" not in self.ids:
            self.ids["pending_interrupted"] = a["id"]
        elif a["status"] == "consumed" and a["kind"] == "policy":
            if shape[0] == "long":
                self.ids["decided_policy_long"] = a["id"]
                self.ids["decided_policy_long_step"] = a["step"]["index"]
            elif "decided_policy" not in self.ids or (
                    shape[1] == "refund-desk" and not self.ids["decided_policy_refund"]):
                self.ids["decided_policy"] = a["id"]
                self.ids["decided_policy_refund"] = shape[1] == "refund-desk"

    def _workers(self) -> list[tuple]:
        table, dt, rng = self.tables[Worker], self.loader.dt, self.rng
        rows = []
        for n, owner in enumerate(self.owners.live + self.owners.dead_rows):
            host, pid = owner.split("@")[1].split(":")[:2]
            dead = owner in self.owners.dead_rows
            beat = self.now - timedelta(minutes=10 if dead else 0, seconds=rng.uniform(0, 2))
            rows.append(table.row({
                "id": n + 1, "owner": owner, "name": "worker", "host": host, "pid": int(pid),
                "boot_id": f"{rng.getrandbits(128):032x}", "proc_start": rng.randint(10**5, 10**8),
                "lease_seconds": LEASE, "started_at": dt(self.now - timedelta(hours=6 + n)),
                "heartbeat_at": dt(beat), "concurrency": 8, "runs_held": self.held[owner]}))
        self.counts["workers live"] = len(self.owners.live)
        self.counts["workers dead"] = len(self.owners.dead_rows)
        return rows

    def summary(self) -> dict[str, Any]:
        c = self.counts
        owners = set(self.owners.all())
        return {
            "runs": c["runs"], "steps": c["steps"], "events": c["events"],
            "approvals": c["approvals"], "pending": c["approvals policy pending"]
            + c["approvals interrupted_side_effect pending"],
            "workers": c["workers live"] + c["workers dead"],
            "workers_live": c["workers live"], "workers_dead": c["workers dead"],
            "runs_by_status": {k.split()[1]: v for k, v in sorted(c.items())
                               if k.startswith("runs ")},
            "approvals_by_kind_status": {k.removeprefix("approvals "): v
                                         for k, v in sorted(c.items())
                                         if k.startswith("approvals ")},
            "event_kinds": dict(self.kinds.most_common()),
            "actors": len(self.actors), "worker_owners": len(self.actors & owners),
            "people": len(self.actors - owners),
            "dead_owners": len(self.actors & set(self.owners.dead)),
            "payload_bytes_avg": round(self.payload_bytes / max(1, c["events"]), 1),
            **self.ids,
        }


def _long_duration(steps: int) -> timedelta:
    """How long ago the long run started: ~3 s a step, its approvals decided in seconds."""
    return timedelta(seconds=3.2 * steps + 1_800)


def _json(value: Any) -> str | None:
    return None if value is None else dumps(value)


# -- the pages ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Page:
    group: str
    label: str
    path: str
    htmx: bool = False


def pages(built: dict[str, Any]) -> list[Page]:
    """Every page measured, with the ids found in the data set."""
    long_run, short = built["long_run"], built["short_run"]
    per_page = ReadOnlyAdmin.list_per_page
    # Page 300 (rows 14,951-15,000: past the 10,000 rows the admin counts), or the last.
    deep = max(1, min(DEEP_PAGE, math.ceil(built["event_kinds"].get(DEEP_KIND, 0) / per_page)))
    c = [
        Page("console", "queue", reverse("console:queue")),
        Page("console", "queue, htmx poll", reverse("console:queue"), htmx=True),
        Page("console", "queue, ?kind=policy", reverse("console:queue") + "?kind=policy"),
        Page("console", "queue, ?kind=interrupted_side_effect",
             reverse("console:queue") + "?kind=interrupted_side_effect"),
        Page("console", "pending count, htmx", reverse("console:pending-count"), htmx=True),
    ]
    for name, label in (("pending_interrupted", "approval: pending interrupted_side_effect"),
                        ("decided_policy", "approval: decided policy (short run)"),
                        ("decided_policy_long", "approval: decided policy, long run step "
                         f"{built.get('decided_policy_long_step', 0):,}")):
        path = reverse("console:approval", args=[built[name]])
        c += [Page("console", label, path), Page("console", label + ", htmx poll", path, True)]
    run = reverse("console:run", args=[long_run])
    runs = reverse("console:runs")
    c += [
        Page("console", "runs", runs),
        Page("console", "runs, ?status=failed", runs + "?status=failed"),
        Page("console", "runs, ?before=<middle id>", runs + f"?before={built['runs'] // 2}"),
        Page("console", f"run: {built['long_run_steps']:,} steps", run),
        Page("console", f"run: {built['long_run_steps']:,} steps, htmx poll", run, True),
        Page("console", f"run: {built['short_run_steps']} steps",
             reverse("console:run", args=[short])),
        Page("console", "workers", reverse("console:workers")),
    ]
    events = reverse("admin:runtime_event_changelist")
    a = [
        Page("admin", "events", events),
        Page("admin", f"events, ?kind={FILTER_KIND}", events + f"?kind={FILTER_KIND}"),
        Page("admin", f"events, ?actor={FILTER_ACTOR}", events + f"?actor={FILTER_ACTOR}"),
        Page("admin", "events of the long run", events + f"?run__id__exact={long_run}"),
        Page("admin", f"events, ?kind={DEEP_KIND}, page {deep}",
             events + f"?kind={DEEP_KIND}&p={deep}"),
        Page("admin", "event", reverse("admin:runtime_event_change",
                                       args=[built["event_detail"]])),
        Page("admin", "runs", reverse("admin:runtime_run_changelist")),
        Page("admin", "approvals, ?status=pending",
             reverse("admin:runtime_approval_changelist") + "?status=pending"),
        Page("admin", "steps", reverse("admin:runtime_step_changelist")),
    ]
    return c + a


def _percentile(values: list[float], pct: float) -> float:
    """Nearest rank: the smallest value with ``pct`` percent of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


class _Errors:
    """Exceptions raised by a view (the test client answers 500 instead of raising)."""

    def __init__(self) -> None:
        self.last = ""
        got_request_exception.connect(self.note)

    def note(self, sender: Any = None, request: Any = None, **kwargs: Any) -> None:
        self.last = traceback.format_exc(limit=-3).strip().splitlines()[-1]

    def close(self) -> None:
        got_request_exception.disconnect(self.note)


def time_page(client: Client, page: Page, reps: int, errors: _Errors,
              before: Callable[[], None]) -> dict[str, Any]:
    """One request counted (queries, size, status), then ``reps`` timed, each on a fresh
    connection (opened inside the timing, as a request opens its own): wall-clock time, and
    this thread's CPU time beside it (what a busy neighbour does not inflate), and the time
    the counted request's queries took."""
    headers = {"HX-Request": "true", "HX-Current-URL": f"http://testserver{page.path}"} \
        if page.htmx else {}
    before()
    connections.close_all()
    errors.last = ""
    sql: list[float] = []

    def timed(execute: Callable, query: str, params: Any, many: bool, context: Any) -> Any:
        start = time.perf_counter()
        try:
            return execute(query, params, many, context)
        finally:
            sql.append(time.perf_counter() - start)

    with CaptureQueriesContext(connection) as queries, connection.execute_wrapper(timed):
        response = client.get(page.path, headers=headers)
    captured = queries.captured_queries  # now: the next request resets the log
    sql_ms = 1000 * sum(sql)
    status = response.status_code
    answer = str(status)
    if 300 <= status < 400:
        answer = f"{status} → {response.get('Location', '?')}"
    elif status >= 400 and errors.last:
        answer = f"{status} ({errors.last[:120]})"
    times, cpu = [], []
    for _ in range(reps):
        connections.close_all()
        start, start_cpu = time.perf_counter(), time.thread_time()
        r = client.get(page.path, headers=headers)
        times.append(1000 * (time.perf_counter() - start))
        cpu.append(1000 * (time.thread_time() - start_cpu))
        if r.status_code != status:
            answer += f"; then {r.status_code}"
    connections.close_all()
    p95 = _percentile(times, 95)
    return {"group": page.group, "page": page.label, "path": page.path, "htmx": page.htmx,
            "status": status, "answer": answer, "p50_ms": statistics.median(times),
            "p95_ms": p95, "min_ms": min(times), "max_ms": max(times), "reps": reps,
            "cpu_p50_ms": statistics.median(cpu),
            "queries": len(captured), "sql_ms": sql_ms, "bytes": len(response.content),
            "over_target": p95 > TARGET_MS}


def _static_settings() -> dict[str, Any]:
    """The manifest storage needs ``collectstatic``'s manifest; without one, plain URLs."""
    if (Path(settings.STATIC_ROOT) / "staticfiles.json").exists():
        return {}
    return {"STORAGES": {**settings.STORAGES, "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}}


def measure_pages(built: dict[str, Any], reps: int, live_owners: list[str],
                  progress: Callable[[str], None]) -> list[dict[str, Any]]:
    user_model = get_user_model()
    user = user_model.objects.create_superuser(ADMIN_USER, f"{ADMIN_USER}@example.com", None)
    client = Client(raise_request_exception=False)
    client.force_login(user)
    errors = _Errors()

    def heartbeat() -> None:  # the live workers' heartbeat, as theirs would keep it fresh
        Worker.objects.filter(owner__in=live_owners).update(heartbeat_at=datetime.now(UTC))

    hosts = [*settings.ALLOWED_HOSTS, "testserver"]
    out = []
    try:
        with override_settings(ALLOWED_HOSTS=hosts, **_static_settings()), \
                warnings.catch_warnings():
            warnings.filterwarnings("ignore", "No directory at", UserWarning)  # whitenoise's
            for page in pages(built):
                progress(f"page {page.group}: {page.label}")
                out.append(time_page(client, page, reps, errors, heartbeat))
    finally:
        errors.close()
    return out


def counted(long_run: int) -> dict[str, int]:
    """The data set as the database holds it (not as the builder meant it)."""
    return {
        "runs": Run.objects.count(), "steps": Step.objects.count(),
        "events": Event.objects.count(), "approvals": Approval.objects.count(),
        "pending": Approval.objects.filter(status="pending").count(),
        "workers": Worker.objects.count(),
        "long_run_steps": Step.objects.filter(run_id=long_run).count(),
        "long_run_events": Event.objects.filter(run_id=long_run).count(),
    }


def measure(loader: Any, sizes: Sizes, quick: bool,
            progress: Callable[[str], None]) -> dict[str, Any]:
    """Build the data set with ``loader`` into the database Django's default connection is
    pointed at (fresh and migrated), then time the pages."""
    connections.close_all()
    load = os.getloadavg()[0]
    progress("console: building the data set")
    start = time.perf_counter()
    now = datetime.now(UTC).replace(microsecond=0)
    builder = Builder(loader, sizes, now)
    try:
        built = builder.build(lambda s: progress(f"console: built {s}"))
    finally:
        loader.close()
    build_seconds = time.perf_counter() - start
    built["event_detail"] = _event_detail(built)
    progress("console: counting what the database holds")
    db = counted(built["long_run"])
    progress("console: timing the pages")
    start = time.perf_counter()
    timed = measure_pages(built, sizes.reps, builder.owners.live, progress)
    over = [p for p in timed if p["over_target"]]
    bad = [p for p in timed if p["status"] != 200]
    figure = (f"{len(timed) - len(over)} of {len(timed)} pages; slowest p95 "
              f"{max(p['p95_ms'] for p in timed):.0f} ms ("
              f"{max(timed, key=lambda p: p['p95_ms'])['page']})")
    return {
        "section": "console", "quick": quick, "engine": loader.engine,
        "machine": {"sqlite": sqlite3.sqlite_version, "python": platform.python_version(),
                    "cpus": os.cpu_count() or 1, "database": str(getattr(loader, "path", "")),
                    "load_before": load, "load_after": os.getloadavg()[0]},
        "sizes": {"runs": sizes.runs, "pending": sizes.pending, "events": sizes.events,
                  "long_run_steps": sizes.long_steps, "reps": sizes.reps},
        "built": built, "counted": db, "build_seconds": build_seconds,
        "database_mib": loader.size_bytes() / 2**20, "pages_seconds": time.perf_counter() - start,
        "target_ms": TARGET_MS, "pages": timed,
        "targets": [
            {"target": f"every page p95 < {TARGET_MS:.0f} ms", "met": not over,
             "figure": figure},
            {"target": "every page answers 200", "met": not bad,
             "figure": "yes" if not bad else "; ".join(f"{p['page']}: {p['answer']}"
                                                       for p in bad)},
        ],
    }


def _event_detail(built: dict[str, Any]) -> int:
    """A lookup's ``step.tool_finished`` (an order, one of the larger payloads) of the short
    run, for the admin's event page."""
    return Event.objects.filter(run_id=built["short_run"], kind="step.tool_finished") \
        .order_by("seq").values_list("pk", flat=True)[0]

