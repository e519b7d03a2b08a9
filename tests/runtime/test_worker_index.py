"""The Workers page's filters and order by the last heartbeat read an index, not the table."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection

from runtime.models import Worker


@pytest.mark.engines
def test_worker_heartbeats_are_indexed(database):
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, Worker._meta.db_table)
    assert any(c["index"] and c["columns"] == ["heartbeat_at"] for c in found.values())


@pytest.mark.engines("sqlite")
def test_the_old_workers_tab_reads_the_heartbeat_index(database):
    cutoff = datetime(2026, 1, 1, tzinfo=UTC)
    query = Worker.objects.filter(heartbeat_at__lt=cutoff).order_by("-heartbeat_at")[:50]
    sql, params = query.query.sql_with_params()
    with connection.cursor() as cursor:
        plan = " ".join(str(row) for row in cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    assert "INDEX worker_heartbeat_at" in plan, plan
