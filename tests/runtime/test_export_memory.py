"""An audit export streams: its memory does not grow with the log. Measured (``tracemalloc``
peak during the export) on 20,000 events and on ten times as many, whose export then
verifies line by line against the chain. A million events: ``runtime.benchkit.export``."""

from __future__ import annotations

import pytest

from runtime.audit.export import audit_export
from runtime.audit.export_check import audit_export_verify
from runtime.benchkit.export import fill_events, measure_export
from runtime.models import AuditExport, Event

SMALL, LARGE = 20_000, 200_000


@pytest.mark.slow
def test_a_large_export_takes_the_memory_of_a_small_one(sqlite_path, tmp_path):
    fill_events(SMALL, runs=2)
    small = measure_export(format="csv")
    fill_events(LARGE - SMALL, runs=6)
    large = measure_export(format="csv")
    assert (small["rows"], large["rows"]) == (SMALL, LARGE)
    # Proportional would be ten times; streamed, the peak is one chunk's, whatever the size.
    assert large["peak_mib"] <= small["peak_mib"] * 1.5 + 0.5, (small, large)
    assert large["bytes"] > 9 * small["bytes"]
    path = tmp_path / "export.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        row = audit_export(fh, format="jsonl", by="auditor")
    with open(path, encoding="utf-8", newline="") as fh:
        result = audit_export_verify(fh)
    assert result.ok, result.problems
    assert result.lines == result.verified == Event.objects.count() == LARGE
    assert result.runs == 8 and row.rows == LARGE
    assert AuditExport.objects.count() == 3
