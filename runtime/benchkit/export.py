"""What an audit export costs: events per second and peak memory, on a log of N events filled
fast (raw ``executemany``, hashes chained as the runtime chains them, so the export verifies).

Peak memory is Python's own allocations (``tracemalloc``) while exporting, from just before
the first query to the record: bounded means the same for 20,000 events as for 1,000,000.
"""

from __future__ import annotations

import resource
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction

from runtime.audit.export import audit_export
from runtime.models import Run
from runtime.storage.events import EventSpec, build_events

_BATCH = 20_000
_KINDS = ("step.started", "step.decided", "step.tool_started", "step.tool_finished")
START = datetime(2026, 1, 1, tzinfo=UTC)


def fill_events(n: int, runs: int = 4, *, at: datetime = START) -> list[int]:
    """Add ``runs`` runs holding ``n`` events between them (each a hash chain from event #1,
    one event a millisecond); returns the runs' ids. SQLite only: raw inserts of its rows."""
    assert connection.vendor == "sqlite", "the fast fill writes SQLite's row format"
    ids = [Run.objects.create(agent="bench", input={}, created_at=at, updated_at=at).pk
           for _ in range(runs)]
    per_run = [n // runs + (1 if i < n % runs else 0) for i in range(runs)]
    sql = ("INSERT INTO runtime_event (run_id, step_index, seq, kind, payload, actor, at, hash) "
           "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)")
    clock = 0
    for run_id, count in zip(ids, per_run, strict=True):
        seq, head = 0, ""
        while seq < count:
            size = min(_BATCH, count - seq)
            rows: list[tuple] = []
            for _ in range(size):
                when = at + timedelta(milliseconds=clock)
                clock += 1
                i = seq + len(rows)
                spec = EventSpec(_KINDS[i % 4], {"tool": "charge", "arguments": {
                    "amount": i, "to": f"acct-{i % 97:04d}"}, "note": "é" * (i % 7)}, i // 4)
                built, _, head = build_events(run_id, seq + len(rows), head, [spec],
                                              "runtime@bench", when)
                e = built[0]
                rows.append((run_id, e.step_index, e.seq, e.kind, e.payload_text, e.actor,
                             connection.ops.adapt_datetimefield_value(when), e.hash))
            with transaction.atomic(), connection.cursor() as cur:
                cur.executemany(sql, rows)
            seq += size
        Run.objects.filter(pk=run_id).update(event_seq=seq, event_hash=head)
    return ids


class _Sink:
    """A file that keeps only how much was written to it."""

    def __init__(self) -> None:
        self.chars = 0

    def write(self, text: str) -> int:
        self.chars += len(text)
        return len(text)


def measure_export(*, format: str = "csv", **filters: Any) -> dict[str, Any]:
    """Export every event (or ``filters``') to nowhere: rows, seconds, events/s and the peak
    of Python's allocations during the export, in MiB."""
    sink = _Sink()
    tracemalloc.start()
    tracemalloc.reset_peak()
    began = time.perf_counter()
    try:
        row = audit_export(sink, format=format, by="bench", **filters)  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    seconds = time.perf_counter() - began
    return {"rows": row.rows, "seconds": round(seconds, 2),
            "events_per_s": round(row.rows / seconds) if seconds else 0,
            "peak_mib": round(peak / 2**20, 2), "bytes": sink.chars}


def measure_export_rss(*, format: str = "csv") -> dict[str, Any]:
    """The same export without tracemalloc (which slows Python down): its speed, and the
    process's resident memory before and after (its high-water mark, ``ru_maxrss``)."""
    sink = _Sink()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    began = time.perf_counter()
    row = audit_export(sink, format=format, by="bench")  # type: ignore[arg-type]
    seconds = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"rows": row.rows, "seconds": round(seconds, 2),
            "events_per_s": round(row.rows / seconds) if seconds else 0,
            "maxrss_before_mib": round(before / 1024, 1),
            "maxrss_after_mib": round(after / 1024, 1)}


def measure(quick: bool, step: Callable[[str], None]) -> dict[str, Any]:
    """``bench --export``: a log filled to each size in turn, exported as CSV at full speed
    (events/s) and again under ``tracemalloc`` (its peak): bounded means one peak for all."""
    sizes = (20_000, 100_000) if quick else (100_000, 1_000_000)
    rows: list[dict[str, Any]] = []
    filled = 0
    for n in sizes:
        step(f"export: filling to {n:,} events")
        fill_events(n - filled)
        filled = n
        step(f"export: {n:,} events")
        speed = measure_export_rss(format="csv")
        traced = measure_export(format="csv")
        rows.append({"events": n, "seconds": speed["seconds"],
                     "events_per_s": speed["events_per_s"], "peak_mib": traced["peak_mib"],
                     "maxrss_growth_mib": round(speed["maxrss_after_mib"]
                                                - speed["maxrss_before_mib"], 1),
                     "bytes": traced["bytes"]})
    return {"quick": quick, "export": rows}


def render(r: dict[str, Any]) -> str:
    lines = ["Audit export (CSV, SQLite)", "",
             f"{'events':>12} {'seconds':>9} {'events/s':>10} {'peak MiB':>9} "
             f"{'RSS growth MiB':>15}"]
    for row in r["export"]:
        lines.append(f"{row['events']:>12,} {row['seconds']:>9.2f} {row['events_per_s']:>10,} "
                     f"{row['peak_mib']:>9.2f} {row['maxrss_growth_mib']:>15.1f}")
    lines.append("")
    lines.append("peak: Python's allocations during the export (tracemalloc); RSS growth: the "
                 "process's high-water mark before and after it")
    return "\n".join(lines) + "\n"
