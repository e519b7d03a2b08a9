"""An audit record that cannot be quietly rewritten: each tampering found by someone who could
drop the append-only triggers (design §9) is caught by ``verifyaudit`` — by the triggers'
check, the global chain of run creations, the rows replayed from the events, or a signed
checkpoint taken before the tampering. Every test here tampers as that person would (the
triggers dropped, hashes recomputed where that hides the edit) and fails without the anchors.
"""

from __future__ import annotations

import io
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from runtime import Agent, FinalAnswer, ScriptedLLM, ToolCall, resume, start
from runtime.agents.agent import registry
from runtime.approvals.decisions import approve
from runtime.audit.check import triggers_problems
from runtime.audit.checkpoint import checkpoint_load
from runtime.audit.creations import creations_verify
from runtime.errors import CheckpointRefused
from runtime.models import Approval, AuditCheckpoint, Event, Run, RunCreation, Step
from runtime.storage.creations import creation_hash
from runtime.storage.events import event_hash
from runtime.storage.triggers import APPEND_ONLY_TABLES, expected_triggers
from tests.kit import Ledger, broken, charges_need_approval, make_agent, make_tools, verifyaudit

pytestmark = pytest.mark.engines

KEY = "k" * 40


@pytest.fixture(autouse=True)
def audit_key(settings):
    settings.RUNTIME = {**settings.RUNTIME, "AUDIT_KEY": KEY}


@pytest.fixture
def runs(database, tmp_path, clock):
    """Three finished runs and one whose charge a person approved (policy), all verified."""
    ledger = Ledger(tmp_path / "ledger")
    plain = make_agent("an", [ToolCall("read", {"key": "a"}), ToolCall("charge", {"amount": 3}),
                              FinalAnswer("ok")], ledger)

    gated = Agent("gated", ScriptedLLM([ToolCall("charge", {"amount": 9}), FinalAnswer("done")]),
                  make_tools(ledger), policy=charges_need_approval)
    with registry.override(plain, gated):
        done = [resume(start("an", {"n": i}, created_by="carol", clock=clock).pk,
                       clock=clock, lease_seconds=5) for i in range(3)]
        paused = resume(start("gated", {}, created_by="carol", clock=clock).pk, clock=clock,
                        lease_seconds=5)
        approval = Approval.objects.get(run_id=paused.pk)
        approve(approval.pk, by="alice", note="fine", now=clock.now())
        done.append(resume(paused.pk, clock=clock, lease_seconds=5))
    assert [r.status for r in done] == ["succeeded"] * 4
    verifyaudit()  # the untouched record is clean
    return done


def checkpoint(tmp_path, name: str = "cp.json") -> str:
    path = tmp_path / name
    call_command("auditcheckpoint", "--out", str(path), stderr=io.StringIO())
    return str(path)


def drop_triggers() -> None:
    """What a person with DDL rights does first."""
    with connection.cursor() as cur:
        for table in APPEND_ONLY_TABLES:
            if connection.vendor == "sqlite":
                for op in ("update", "delete"):
                    cur.execute(f"DROP TRIGGER {table}_no_{op}")
            else:
                cur.execute(f"DROP TRIGGER {table}_no_update_delete ON {table}")
                cur.execute(f"DROP TRIGGER {table}_no_truncate ON {table}")


@contextmanager
def tampering() -> Iterator[None]:
    """Drop the triggers, let the body edit, then put the triggers back exactly as they were:
    a careful person covers their tracks, so only the anchors can tell."""
    drop_triggers()
    yield
    with connection.cursor() as cur:
        for sql in expected_triggers(connection.vendor).values():
            cur.execute(sql)
    assert triggers_problems() == []


def rechain(run_id: int) -> None:
    """Recompute a run's hashes after an edit, and its head, so its own chain verifies."""
    head = ""
    for e in Event.objects.filter(run_id=run_id).order_by("seq"):
        head = event_hash(head, run_id=run_id, seq=e.seq, kind=e.kind, step_index=e.step_index,
                          payload=e.payload, actor=e.actor, at=e.at)
        Event.objects.filter(pk=e.pk).update(hash=head)
    last = Event.objects.filter(run_id=run_id).order_by("-seq").first()
    Run.objects.filter(pk=run_id).update(event_seq=last.seq if last else 0, event_hash=head)


# -- the triggers --------------------------------------------------------------------------------


def test_a_dropped_trigger_is_reported(runs):
    assert triggers_problems() == []
    drop_triggers()
    err = broken()
    for table in APPEND_ONLY_TABLES:
        assert table in err
    assert "missing" in err


def test_a_trigger_replaced_by_one_that_lets_everything_through_is_reported(runs):
    with connection.cursor() as cur:
        if connection.vendor == "sqlite":
            cur.execute("DROP TRIGGER runtime_event_no_update")
            cur.execute("CREATE TRIGGER runtime_event_no_update BEFORE UPDATE ON runtime_event "
                        "WHEN 0 BEGIN SELECT RAISE(ABORT, 'runtime_event is append-only'); END")
            assert "runtime_event_no_update was altered" in broken()
        else:
            cur.execute("ALTER TABLE runtime_event DISABLE TRIGGER runtime_event_no_update_delete")
            assert "runtime_event_no_update_delete is disabled" in broken()
            cur.execute("ALTER TABLE runtime_event ENABLE TRIGGER runtime_event_no_update_delete")
            cur.execute("CREATE OR REPLACE FUNCTION runtime_event_append_only() RETURNS trigger "
                        "AS $$ BEGIN RETURN OLD; END $$ LANGUAGE plpgsql")
            assert "runtime_event_append_only() was replaced" in broken()


def test_the_creation_and_checkpoint_records_are_append_only_too(runs, tmp_path):
    from django.db import DatabaseError, transaction

    checkpoint(tmp_path)
    for table in ("runtime_runcreation", "runtime_auditcheckpoint"):
        for sql in (f"UPDATE {table} SET hash = 'x'", f"DELETE FROM {table}"):
            with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), \
                    connection.cursor() as cur:
                cur.execute(sql)
    verifyaudit()


# -- the tampering the review found --------------------------------------------------------------


def roll_back(run_id: int) -> int:
    """Delete the run's events from ``run.succeeded`` on and point its head at the one before;
    returns the sequence number of the last event deleted."""
    end = Event.objects.get(run_id=run_id, kind="run.succeeded").seq
    last = Event.objects.filter(run_id=run_id).order_by("-seq").first().seq
    Event.objects.filter(run_id=run_id, seq__gte=end).delete()
    prev = Event.objects.get(run_id=run_id, seq=end - 1)
    Run.objects.filter(pk=run_id).update(event_seq=prev.seq, event_hash=prev.hash)
    return last


def delete_run(run_id: int) -> None:
    Event.objects.filter(run_id=run_id).delete()
    Approval.objects.filter(run_id=run_id).delete()
    Step.objects.filter(run_id=run_id).delete()
    Run.objects.filter(pk=run_id).delete()


def test_a_run_rolled_back_is_found_by_its_rows(runs):
    run = runs[0]
    with tampering():
        roll_back(run.pk)
    err = broken()
    assert f"run {run.pk}: BROKEN: its rows disagree with its events" in err
    assert "status is 'succeeded' in the row" in err


def test_a_run_rolled_back_row_and_all_is_found_by_a_checkpoint(runs, tmp_path):
    run = runs[0]
    path = checkpoint(tmp_path)
    with tampering():
        last = roll_back(run.pk)
        # The row is rolled back too, to what the remaining events say: the log and the rows
        # agree again, so only something kept off the database can tell.
        taken = Event.objects.get(run_id=run.pk, kind="lease.taken").payload
        Run.objects.filter(pk=run.pk).update(status="running", output=None,
                                             lease_owner=taken["owner"], lease_epoch=1,
                                             lease_expires_at=run.created_at)
    problems = [line for line in broken("--checkpoint", path).splitlines() if line]
    assert problems == [f"run {run.pk}: event #{last}, its last at checkpoint #1, is gone "
                        "(the run was deleted or rolled back)"], problems


def test_an_events_actor_rewritten_and_rechained_is_found_by_a_checkpoint(runs, tmp_path):
    run = runs[3]
    path = checkpoint(tmp_path)
    with tampering():
        granted = Event.objects.get(run_id=run.pk, kind="approval.granted")
        Event.objects.filter(pk=granted.pk).update(actor="mallory")
        rechain(run.pk)
    verifyaudit()  # inside the database everything agrees: the edit is hidden there
    err = broken("--checkpoint", path)
    assert f"run {run.pk}: its chain up to event #{run.event_seq} differs from checkpoint" in err


def test_a_rewritten_run_created_event_is_found_without_a_checkpoint(runs):
    run = runs[1]
    with tampering():
        first = Event.objects.get(run_id=run.pk, seq=1)
        Event.objects.filter(pk=first.pk).update(payload={**first.payload, "input": {"n": 99}})
        Run.objects.filter(pk=run.pk).update(input={"n": 99})
        rechain(run.pk)
    err = broken()
    assert f"run {run.pk}: its run.created event is not the one the global chain recorded" in err


def test_a_deleted_run_is_found_by_the_global_chain(runs):
    run = runs[2]
    with tampering():
        delete_run(run.pk)
    err = broken()
    assert f"run {run.pk} was deleted: the global chain records its creation" in err


def test_a_deleted_run_and_its_rechained_creation_record_are_found_by_a_checkpoint(runs,
                                                                                   tmp_path):
    run = runs[0]
    path = checkpoint(tmp_path)
    with tampering():
        delete_run(run.pk)
        RunCreation.objects.filter(run_id=run.pk).delete()
        prev = ""
        for n, entry in enumerate(RunCreation.objects.order_by("seq"), start=1):
            prev = creation_hash(prev, seq=n, run_id=entry.run_id, agent=entry.agent,
                                 created_by=entry.created_by, at=entry.at,
                                 first_hash=entry.first_hash)
            RunCreation.objects.filter(pk=entry.pk).update(seq=n, hash=prev)
    verifyaudit()  # consistent inside the database now
    err = broken("--checkpoint", path)
    assert "is not the one checkpoint #1 recorded" in err
    assert f"run {run.pk}: event #" in err and "is gone" in err


def test_a_run_inserted_behind_the_runtimes_back_is_found(runs, clock):
    Run.objects.create(agent="an", input={}, created_at=clock.now(), updated_at=clock.now())
    assert "have no creation entry" in broken()


@pytest.mark.parametrize("field,value", [("decided_by", "mallory"), ("note", "all good"),
                                         ("status", "rejected")])
def test_an_approvals_decision_rewritten_is_found_by_its_events(runs, field, value):
    approval = Approval.objects.get(run_id=runs[3].pk)
    Approval.objects.filter(pk=approval.pk).update(**{field: value})  # no trigger guards rows
    err = broken()
    assert f"run {runs[3].pk}: BROKEN" in err and f"approval {approval.pk}: {field}" in err


def test_a_checkpoint_record_deleted_from_the_database_is_found(runs, tmp_path):
    path = checkpoint(tmp_path)
    with tampering():
        AuditCheckpoint.objects.all().delete()
    assert "checkpoint #1: its record is missing from the database" in broken("--checkpoint",
                                                                              path)


# -- checkpoints ---------------------------------------------------------------------------------


def test_a_checkpoint_holds_while_runs_go_on_after_it(runs, tmp_path, clock):
    first = checkpoint(tmp_path, "one.json")
    ledger = Ledger(tmp_path / "ledger2")
    with registry.override(make_agent("an", [FinalAnswer("later")], ledger)):
        resume(start("an", {}, clock=clock).pk, clock=clock, lease_seconds=5)
    second = checkpoint(tmp_path, "two.json")
    assert "checkpoint #1 holds" in verifyaudit("--checkpoint", first)
    assert "checkpoint #2 holds" in verifyaudit("--checkpoint", second)
    doc = checkpoint_load(second)
    assert doc["runs"] == len(doc["heads"]) == 5 and doc["creations_seq"] == 5


def test_a_checkpoint_file_is_private_and_whole(runs, tmp_path):
    old = os.umask(0o022)
    try:
        path = checkpoint(tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    doc = json.loads(Path(path).read_text())
    assert doc["format"] == "runtime-audit-checkpoint" and len(doc["signature"]) == 64


def test_an_altered_checkpoint_file_or_another_key_is_refused(runs, tmp_path, settings):
    path = checkpoint(tmp_path)
    doc = json.loads(Path(path).read_text())
    doc["heads"][0][2] = "0" * 64
    (tmp_path / "forged.json").write_text(json.dumps(doc))
    with pytest.raises(CommandError, match="signature does not match"):
        verifyaudit("--checkpoint", str(tmp_path / "forged.json"))
    settings.RUNTIME = {**settings.RUNTIME, "AUDIT_KEY": "x" * 40}
    with pytest.raises(CommandError, match="signature does not match"):
        verifyaudit("--checkpoint", path)
    (tmp_path / "junk.json").write_text("[[[")
    with pytest.raises(CheckpointRefused, match="not a checkpoint file"):
        checkpoint_load(tmp_path / "junk.json")


@pytest.mark.parametrize("key,message", [("", "RUNTIME_AUDIT_KEY is not set"),
                                         ("short", "at least 32 are needed")])
def test_no_checkpoint_without_a_real_key(runs, tmp_path, settings, key, message):
    settings.RUNTIME = {**settings.RUNTIME, "AUDIT_KEY": key}
    with pytest.raises(CommandError, match=message):
        call_command("auditcheckpoint", "--out", str(tmp_path / "cp.json"))
    assert not (tmp_path / "cp.json").exists()
    assert AuditCheckpoint.objects.count() == 0


def test_the_migration_enters_existing_runs_into_the_global_chain(runs):
    out = io.StringIO()
    call_command("migrate", "runtime", "0008", stdout=out)  # a database from before anchors
    call_command("migrate", "runtime", stdout=out)
    entries = list(RunCreation.objects.order_by("seq").values_list("seq", "run_id"))
    assert entries == [(n, r.pk) for n, r in enumerate(sorted(runs, key=lambda r: r.pk), 1)]
    assert list(creations_verify()) == []
    assert triggers_problems() == []


def test_verifyaudit_reads_runs_in_batches_and_misses_none(runs, monkeypatch):
    monkeypatch.setattr("runtime.audit.check._BATCH", 3)  # 4 runs: a full batch and a short one
    Approval.objects.filter(run_id=runs[3].pk).update(decided_by="mallory")
    Step.objects.filter(run_id=runs[0].pk, index=1).update(result={"forged": True})
    err = io.StringIO()
    with pytest.raises(CommandError, match="2 of 4 runs broken"):
        call_command("verifyaudit", stdout=io.StringIO(), stderr=err)
    assert f"run {runs[0].pk} step 1: result" in err.getvalue()
    assert f"run {runs[3].pk} approval" in err.getvalue()
