"""Query cost as the tables grow: the worker's claim queries and the console's queue pages
with 10k, 100k and 1M finished runs, their times and the index SQLite chose for each.

Rows are bulk-inserted with plain sqlite3 (executemany, big transactions) into a copy of the
freshly migrated bench database; the queries run through the ORM exactly as the code runs them.
"""

from __future__ import annotations

import sqlite3
import statistics
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import connection
from django.db.models import Model
from django.db.models.query import RawQuerySet

from runtime.effects import Effect
from runtime.leasing.claims import runnable
from runtime.models import Approval, Run, Step
from runtime.selectors.approvals import pending

AGENTS = ("bench_read", "bench_write", "hello", "refunds")
OPEN = 25  # waiting runs with a pending approval, and as many queued runs, in every size
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _builder(model: type[Model], values: dict[str, Any]) -> tuple[str, Callable[[int], tuple]]:
    """INSERT for ``model`` (explicit ids) and a row function of the id: a value in ``values``
    (or a function of the id returning what the column stores), else the field's default."""
    fields = model._meta.concrete_fields
    cols = ", ".join(f'"{f.column}"' for f in fields)
    sql = (f'INSERT INTO "{model._meta.db_table}" ({cols}) '
           f'VALUES ({", ".join("?" * len(fields))})')
    fixed: list[Any] = []
    for f in fields:
        if f.primary_key or callable(values.get(f.name)):
            fixed.append(None)
        elif f.name in values:
            fixed.append(_prep(f, values[f.name]))
        else:  # the field's default: "" for text, None where nullable
            fixed.append(_prep(f, f.get_default()))
    funcs = [(i, values[f.name]) for i, f in enumerate(fields)
             if not f.primary_key and callable(values.get(f.name))]

    def row(pk: int) -> tuple:
        out = list(fixed)
        out[0] = pk
        for i, fn in funcs:
            out[i] = fn(pk)
        return tuple(out)

    if not fields[0].primary_key:  # pragma: no cover - every runtime model starts with its id
        raise RuntimeError(f"{model.__name__}: the id is not the first column")
    return sql, row


def _prep(field: Any, value: Any) -> Any:
    if isinstance(value, datetime):
        return connection.ops.adapt_datetimefield_value(value)
    return field.get_db_prep_save(value, connection)


def _at(pk: int) -> str:
    """A creation time as the SQLite backend stores it (naive UTC text), one second apart."""
    return (T0 + timedelta(seconds=pk)).replace(tzinfo=None).isoformat(" ")


class Filler:
    """Grows the scale database to a number of finished runs, 1 in 10 with a consumed policy
    approval (and its step); a fixed set of open approvals and queued runs is made first."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("PRAGMA cache_size=-262144")  # this connection's cache: 256 MiB
        self.next_id = 1
        self.finished = 0

    def _runs(self, status: Any) -> tuple[str, Callable[[int], tuple]]:
        return _builder(Run, {
            "agent": lambda pk: AGENTS[pk % len(AGENTS)], "input": {}, "status": status,
            "failure_code": lambda pk: "error" if _failed(pk) else "",
            "created_at": T0, "updated_at": T0, "event_seq": 4, "event_hash": "0" * 64})

    def _approvals(self, status: str) -> list[tuple[str, Callable[[int], tuple]]]:
        step = _builder(Step, {"run": lambda pk: pk, "index": 1, "status": "succeeded",
                               "tool": "bench_write", "arguments": {"n": 1},
                               "effect": Effect.SIDE_EFFECT, "idempotency_key": lambda pk: f"k{pk}",
                               "attempt": 1, "started_at": T0, "finished_at": T0})
        approval = _builder(Approval, {
            "run": lambda pk: pk, "step": lambda pk: pk, "kind": "policy", "status": status,
            "tool": "bench_write", "arguments": {"n": 1}, "effect": Effect.SIDE_EFFECT,
            "digest": "0" * 64, "title": "bench", "created_at": _at})
        return [step, approval]

    def _insert(self, count: int, runs: tuple, with_approval: Callable[[int], bool],
                approvals: list[tuple]) -> None:
        first = self.next_id
        self.next_id += count
        for lo in range(first, first + count, 100_000):
            ids = range(lo, min(lo + 100_000, first + count))
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany(runs[0], map(runs[1], ids))
            for sql, row in approvals:
                self.conn.executemany(sql, map(row, filter(with_approval, ids)))
            self.conn.execute("COMMIT")

    def open_work(self) -> None:
        self._insert(OPEN, self._runs("waiting"), lambda pk: True, self._approvals("pending"))
        self._insert(OPEN, self._runs("queued"), lambda pk: False, [])

    def grow_to(self, finished: int) -> None:
        count = finished - self.finished
        runs = self._runs(lambda pk: "failed" if _failed(pk) else "succeeded")
        self._insert(count, runs, lambda pk: pk % 10 == 0, self._approvals("consumed"))
        self.finished = finished

    def close(self) -> None:
        self.conn.close()


def _failed(pk: int) -> bool:
    return pk % 20 == 7


def _queries() -> dict[str, Callable[[], Any]]:
    """The queries measured: what the worker and the console run, through the same code (a
    claim tries its two queries in turn, ``runtime.leasing.claims.runnable``)."""
    return {
        "claim: expired leases": lambda: runnable()[0],
        "claim: queued, oldest first": lambda: runnable()[1],
        "claim: queued, --agents": lambda: runnable(agents=["bench_read"])[1],
        "queue: pending approvals": lambda: pending()[:50],
        "runs list: status, -id": lambda: Run.objects.filter(status="failed")
        .order_by("-id")[:50],
    }


def _timed(fn: Callable[[], Any], reps: int) -> dict[str, float]:
    """``ms``: the fastest of ``reps`` runs, the query's own cost (what grows with the table,
    if anything does; a busy neighbour only ever adds time); ``median_ms`` alongside."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"ms": 1000 * min(times), "median_ms": 1000 * statistics.median(times)}


def _plan(qs: Any) -> str:
    """EXPLAIN QUERY PLAN, one line per step, SQLite's own words."""
    if isinstance(qs, RawQuerySet):  # the claim's own statement
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN QUERY PLAN {qs.raw_query}", qs.params)
            return " / ".join(row[-1] for row in cursor.fetchall())
    return " / ".join(line.split(" ", 3)[-1] if line[:1].isdigit() else line
                      for line in qs.explain().splitlines())


def _measured(make: Callable[[], Any], reps: int) -> dict[str, Any]:
    """One query's timings (its rows read each time) and its plan, the page cache warmed."""
    list(make())  # warm the page cache
    return {**_timed(lambda: list(make()), reps), "plan": _plan(make())}


def measure(path: Path, sizes: list[int], reps: int) -> Iterator[dict[str, Any]]:
    """For each size: fill, then time each query (fastest and median of ``reps``) and record
    its plan."""
    filler = Filler(path)
    try:
        filler.open_work()
        for size in sizes:
            start = time.perf_counter()
            filler.grow_to(size)
            fill = time.perf_counter() - start
            row: dict[str, Any] = {"finished_runs": size, "fill_seconds": fill, "queries": {}}
            for name, make in _queries().items():
                row["queries"][name] = _measured(make, reps)
            yield row
    finally:
        filler.close()
