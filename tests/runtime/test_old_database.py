"""A database made by an earlier release still verifies: every hash in it was taken over the
canonical form as it was then, so an encoder or hashing change that moved one byte would
break it. ``fixtures/database-protocol6.sql`` is a SQLite dump made at protocol 6 (runs
finished, approved, rejected, resolved after a crash, cancelled, queued, and held by a
restore, with unicode and floats in their payloads); it is loaded, migrated to this code's
schema, and verified end to end."""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import pytest
from django.core.management import call_command

from runtime.audit.chain import verify
from runtime.benchkit.db import use_database
from runtime.models import Event, Run

DUMP = Path(__file__).parent / "fixtures" / "database-protocol6.sql"


@pytest.fixture
def old_database(tmp_path, _sqlite_settings, django_db_blocker):
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(DUMP.read_text())
    db.close()
    with django_db_blocker.unblock():
        use_database({**_sqlite_settings, "NAME": str(path)})
        try:
            call_command("migrate", verbosity=0, interactive=False)
            yield path
        finally:
            use_database(_sqlite_settings)


def test_a_database_of_an_earlier_release_verifies(old_database):
    assert Run.objects.count() == 9 and Event.objects.count() == 201
    out = io.StringIO()
    call_command("verifyaudit", stdout=out)
    assert out.getvalue().startswith("ok: 9 runs verified"), out.getvalue()
    for run_id in Run.objects.values_list("pk", flat=True):
        assert verify(run_id).ok, verify(run_id).problems
    assert set(Run.objects.values_list("status", flat=True)) == {
        "succeeded", "failed", "cancelled", "queued", "waiting"}
