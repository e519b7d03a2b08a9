"""The audit log: gapless per-run sequence, a verifiable hash chain, append-only in the database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from runtime import FinalAnswer, ToolCall, resume, start
from runtime.agents.agent import registry
from runtime.audit.chain import verify
from runtime.models import Event
from runtime.storage.events import EventSpec
from tests.kit import Ledger, make_agent

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def finished_runs(sqlite_path, tmp_path):
    agent = make_agent("au", [ToolCall("read", {"key": "a"}), ToolCall("charge", {"amount": 3}),
                              FinalAnswer("ok")], Ledger(tmp_path / "ledger"))
    with registry.override(agent):
        runs = [resume(start("au", {"n": i}).pk, lease_seconds=5) for i in range(3)]
    return runs


def test_events_are_gapless_per_run_and_the_chain_verifies(finished_runs):
    for run in finished_runs:
        seqs = list(Event.objects.filter(run_id=run.pk).order_by("seq").values_list("seq",
                                                                                     flat=True))
        assert seqs == list(range(1, len(seqs) + 1))
        result = verify(run)
        assert result.ok, str(result)
        assert result.events == len(seqs) == run.event_seq


def test_unknown_event_kinds_are_refused():
    with pytest.raises(ValueError, match="unknown event kind"):
        EventSpec("run.teleported", {})


def test_the_database_refuses_update_and_delete_of_events(finished_runs):
    run = finished_runs[0]
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Event.objects.filter(run_id=run.pk, seq=2).update(actor="mallory")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Event.objects.filter(run_id=run.pk, seq=2).delete()
    with pytest.raises(DatabaseError, match="append-only"), connection.cursor() as cur:
        cur.execute("UPDATE runtime_event SET payload = '{}' WHERE run_id = %s", [run.pk])
    assert verify(run).ok


def _drop_triggers() -> None:
    with connection.cursor() as cur:
        cur.execute("DROP TRIGGER runtime_event_no_update")
        cur.execute("DROP TRIGGER runtime_event_no_delete")


def test_verify_finds_a_row_altered_behind_the_triggers_back(finished_runs):
    run, untouched = finished_runs[1], finished_runs[2]
    _drop_triggers()
    with connection.cursor() as cur:
        cur.execute("UPDATE runtime_event SET payload = %s WHERE run_id = %s AND seq = 9",
                    ['{"result": {"charged": 3000}, "attempt": 1}', run.pk])
    result = verify(run)
    assert not result.ok
    assert result.broken_seq == 9
    assert "hash mismatch" in result.reason
    assert verify(untouched).ok

    with pytest.raises(CommandError, match="1 of 3 runs"):
        call_command("verifyaudit")
    with pytest.raises(CommandError, match="1 of 1 runs"):
        call_command("verifyaudit", run=run.pk)
    with pytest.raises(CommandError, match="0 of 1 runs"):  # the dropped triggers still count
        call_command("verifyaudit", run=untouched.pk)


def test_verify_finds_a_deleted_event(finished_runs):
    run = finished_runs[0]
    _drop_triggers()
    with connection.cursor() as cur:
        cur.execute("DELETE FROM runtime_event WHERE run_id = %s AND seq = 4", [run.pk])
    result = verify(run)
    assert not result.ok and result.broken_seq == 4 and "gap" in result.reason


def test_verify_finds_events_cut_off_the_end(finished_runs):
    run = finished_runs[0]
    _drop_triggers()
    with connection.cursor() as cur:
        cur.execute("DELETE FROM runtime_event WHERE run_id = %s AND seq = %s",
                    [run.pk, run.event_seq])
    result = verify(run)
    assert not result.ok and "head" in result.reason


def test_verifyaudit_exits_non_zero_as_a_process(finished_runs, sqlite_path):
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{sqlite_path}"}
    ok = subprocess.run([sys.executable, "manage.py", "verifyaudit"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "ok: 3 runs verified" in ok.stdout
    _drop_triggers()
    with connection.cursor() as cur:
        cur.execute("UPDATE runtime_event SET actor = 'mallory' WHERE run_id = %s AND seq = 3",
                    [finished_runs[2].pk])
    bad = subprocess.run([sys.executable, "manage.py", "verifyaudit"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0
    assert f"run {finished_runs[2].pk}: BROKEN at event #3" in bad.stderr
