"""Design §1: every connection runs WAL + synchronous=FULL + BEGIN IMMEDIATE; every state change
and its event are stored together or not at all."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client

from runtime import FinalAnswer, ToolCall, resume, start
from runtime.agents.agent import registry
from runtime.crashpoints import CrashPoint
from runtime.errors import SimulatedCrash
from runtime.leasing.heartbeat import LeaseKeeper
from runtime.models import Event, Run, Step
from runtime.storage.sqlite import committer as sqlite_engine
from tests.kit import Ledger, make_agent


def _pragmas() -> dict:
    with connection.cursor() as cur:
        return {
            "journal_mode": cur.execute("PRAGMA journal_mode").fetchone()[0],
            "synchronous": cur.execute("PRAGMA synchronous").fetchone()[0],
            "busy_timeout": cur.execute("PRAGMA busy_timeout").fetchone()[0],
            "connection": id(connection.connection),
        }


def test_every_kind_of_connection_is_wal_and_synchronous_full(sqlite_path):
    # The request thread: a real request through the console's URL conf.
    client = Client()
    client.force_login(User.objects.create_user("ops", is_staff=True))  # staff see the PRAGMAs
    response = client.get("/healthz")
    assert response.json() == {"database": "ok", "journal_mode": "wal", "synchronous": 2}

    main = _pragmas()

    # A worker thread: Django gives it a connection of its own.
    seen: dict = {}

    def worker() -> None:
        try:
            seen.update(_pragmas())
        finally:
            connection.close()

    t = threading.Thread(target=worker)
    t.start()
    t.join()

    # The heartbeat's own connection, read from inside a heartbeat tick.
    beat: dict = {}
    keeper = LeaseKeeper(30, interval=0.01, on_tick=lambda: beat.setdefault("p", _pragmas()))
    keeper.start()
    assert keeper.wait_ticks(1, timeout=10)
    keeper.stop()

    for pragmas in (main, seen, beat["p"]):
        assert pragmas["journal_mode"] == "wal"
        assert pragmas["synchronous"] == 2  # FULL
        assert pragmas["busy_timeout"] > 0
    assert len({main["connection"], seen["connection"], beat["p"]["connection"]}) == 3


def test_write_transactions_begin_immediate(sqlite_path):
    connection.ensure_connection()
    statements: list[str] = []
    connection.connection.set_trace_callback(statements.append)
    try:
        with transaction.atomic():
            Run.objects.filter(pk=0).update(status="queued")
    finally:
        connection.connection.set_trace_callback(None)
    assert statements[0] == "BEGIN IMMEDIATE"
    assert statements[-1] == "COMMIT"


def _agent(tmp_path):
    return make_agent("s", [ToolCall("read", {"key": "a"}), FinalAnswer("ok")],
                      Ledger(tmp_path / "ledger"))


def test_a_failure_between_state_update_and_event_insert_stores_neither(sqlite_path, tmp_path,
                                                                        monkeypatch):
    with registry.override(_agent(tmp_path)):
        run = start("s", {})
        before = Run.objects.values().get(pk=run.pk)

        real = sqlite_engine.execute

        def boom_at_the_events(db, sql, params):
            if sql.startswith('INSERT INTO "runtime_event"'):
                raise OSError("disk fell off between the update and the insert")
            return real(db, sql, params)

        monkeypatch.setattr(sqlite_engine, "execute", boom_at_the_events)
        with pytest.raises(OSError):
            resume(run.pk, lease_seconds=5)
        monkeypatch.undo()
        after = Run.objects.values().get(pk=run.pk)
    assert after == before  # still queued, no lease, chain head unchanged
    assert Event.objects.filter(run_id=run.pk).count() == 1  # only run.created


def test_a_crash_inside_a_state_transaction_stores_nothing_of_it(sqlite_path, tmp_path, crash):
    with registry.override(_agent(tmp_path)):
        run = start("s", {})
        resume(run.pk, lease_seconds=5, name="first")  # runs to the end
        run2 = start("s", {})
        crash(CrashPoint.IN_TRANSACTION, step_index=1)
        with pytest.raises(SimulatedCrash):
            resume(run2.pk, lease_seconds=5)
    # The claim committed; the first step's transaction (step.started + llm.requested) did not.
    assert [e.kind for e in Event.objects.filter(run_id=run2.pk).order_by("seq")] == [
        "run.created", "lease.taken", "run.started"]
    assert not Step.objects.filter(run_id=run2.pk).exists()
    assert Run.objects.get(pk=run2.pk).event_seq == 3


def test_chained_rows_hash_exactly_as_the_reference_function(sqlite_path):
    """build_events writes each hash's body by hand (one serialisation of the payload); it must
    equal event_hash, which verify() uses, for any actor, kind, payload and step."""
    from datetime import UTC, datetime

    from runtime.storage.events import EventSpec, build_events, event_hash

    at = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
    specs = [EventSpec("step.decided", {"tool": "née", "args": {"b": [1, 2.5, None], "a": "\""}},
                       3),
             EventSpec("run.started", {}), EventSpec("llm.responded", {"x": "✓"}, 0)]
    rows, seq, head = build_events(41, 6, "f" * 64, specs, 'owner "ö"', at)
    prev = "f" * 64
    for n, (spec, row) in enumerate(zip(specs, rows, strict=True), start=7):
        prev = event_hash(prev, run_id=41, seq=n, kind=spec.kind, step_index=spec.step_index,
                          payload=spec.payload, actor='owner "ö"', at=at)
        assert row.hash == prev and row.seq == n
    assert (seq, head) == (9, prev)


@pytest.mark.django_db
def test_sqlite_times_are_written_exactly_as_the_backend_writes_them():
    """The committer's shortcut for UTC times gives the backend's own text, to the character
    (whole seconds have no fraction), and other zones still go through the backend."""
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    assert connection.vendor == "sqlite"  # this module's database
    for at in (datetime(2026, 12, 6, 3, 4, 5, 123456, tzinfo=UTC),
               datetime(2026, 12, 6, 3, 4, 5, tzinfo=UTC),
               datetime(2026, 12, 6, 4, 4, 5, 7, tzinfo=ZoneInfo("Europe/Paris"))):
        assert sqlite_engine.db_datetime(connection, at) == \
            connection.ops.adapt_datetimefield_value(at)
    assert sqlite_engine.db_datetime(connection, datetime(2026, 1, 1, tzinfo=UTC)) == \
        "2026-01-01 00:00:00"
