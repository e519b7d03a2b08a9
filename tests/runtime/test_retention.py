"""Retention (``manage.py prune``): finished runs archived and removed with the audit still
provable, on both engines. ``verifyaudit`` passes afterwards and ``verifyaudit --archive``
proves the archived runs; the append-only triggers let only the prune's DELETE through; a
prune run twice, or killed half-way, loses nothing; workers keep running throughout; old
notifications, Idempotency-Key answers and idle API tokens go too; SQLite's file shrinks.
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from runtime import (
    Agent,
    FinalAnswer,
    ScriptedLLM,
    ToolCall,
    cancel,
    resume,
    start,
)
from runtime.agents.agent import registry
from runtime.approvals.decisions import approve
from runtime.crashpoints import CrashPoint
from runtime.errors import SimulatedCrash
from runtime.models import (
    Approval,
    AuditCheckpoint,
    Event,
    Notification,
    NotificationAttempt,
    PrunedRun,
    Pruning,
    Run,
    RunCreation,
    Step,
)
from runtime.retention.archive import archive_load, archive_name
from runtime.retention.prune import runs_prune
from runtime.retention.totals import FAILED_ATTEMPTS, retire_in_tx, retired
from tests.kit import Ledger, broken, charges_need_approval, make_agent, make_tools, verifyaudit
from tests.waiting import wait_until

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[2]
KEY = "k" * 40
T0 = datetime(2026, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)


@pytest.fixture(autouse=True)
def audit_key(settings):
    settings.RUNTIME = {**settings.RUNTIME, "AUDIT_KEY": KEY}


def notify(settings) -> None:
    settings.RUNTIME = {**settings.RUNTIME, "NOTIFY": [
        {"name": "ops", "kind": "webhook", "target": "http://127.0.0.1:9/hook"}]}


@pytest.fixture
def history(database, tmp_path, clock, settings):
    """Runs of every kind, each a day apart from 2026-01-01: three finished plainly, one
    finished after a person approved its charge (its notifications delivered), one cancelled;
    then, on day 10, one more finished and two unfinished (waiting on a person, queued)."""
    notify(settings)
    ledger = Ledger(tmp_path / "ledger")
    plain = make_agent("an", [ToolCall("read", {"key": "a"}), ToolCall("charge", {"amount": 3}),
                              FinalAnswer("ok")], ledger)

    gated = Agent("gated", ScriptedLLM([ToolCall("charge", {"amount": 9}), FinalAnswer("done")]),
                  make_tools(ledger), policy=charges_need_approval)
    runs: dict[str, list[int]] = {"old": [], "new": [], "unfinished": []}
    with registry.override(plain, gated):
        for i in range(3):
            runs["old"].append(resume(start("an", {"n": i}, clock=clock).pk, clock=clock,
                                      lease_seconds=5).pk)
            clock.advance(DAY.total_seconds())
        paused = resume(start("gated", {}, created_by="carol", clock=clock).pk, clock=clock,
                        lease_seconds=5)
        approve(Approval.objects.get(run_id=paused.pk).pk, by="alice", note="ok",
                now=clock.now())
        runs["old"].append(resume(paused.pk, clock=clock, lease_seconds=5).pk)
        delivered(paused.pk)
        clock.advance(DAY.total_seconds())
        queued = start("an", {"n": "cancelled"}, clock=clock)
        cancel(queued.pk, by="bob", clock=clock)
        runs["old"].append(queued.pk)
        clock.advance((T0 + 10 * DAY - clock.now()).total_seconds())
        runs["new"].append(resume(start("an", {"n": 9}, clock=clock).pk, clock=clock,
                                  lease_seconds=5).pk)
        runs["unfinished"].append(resume(start("gated", {}, clock=clock).pk, clock=clock,
                                         lease_seconds=5).pk)
        runs["unfinished"].append(start("an", {"n": 10}, clock=clock).pk)
    statuses = dict(Run.objects.values_list("pk", "status"))
    assert [statuses[r] for r in runs["old"]] == ["succeeded"] * 4 + ["cancelled"]
    assert [statuses[r] for r in runs["unfinished"]] == ["waiting", "queued"]
    assert Notification.objects.filter(approval__run_id=runs["old"][3]).exists()
    assert verifyaudit().startswith("ok")
    return runs


def delivered(run_id: int) -> None:
    """The outbox delivered every notification about the run (as a worker would record it)."""
    for note in Notification.objects.filter(approval__run_id=run_id):
        NotificationAttempt.objects.create(notification=note, number=1, at=note.created_at,
                                           ok=True, status_code=200)
        Notification.objects.filter(pk=note.pk).update(status="delivered", attempts=1,
                                                       delivered_at=note.created_at)


def prune(*args: str) -> str:
    out = io.StringIO()
    call_command("prune", *args, stdout=out, stderr=out)
    return out.getvalue()


def run_ids() -> set[int]:
    return set(Run.objects.values_list("pk", flat=True))


# -- what a prune does ------------------------------------------------------------------------

def test_finished_runs_are_archived_removed_and_still_proved(history, tmp_path):
    archive = tmp_path / "archive"
    creations = RunCreation.objects.count()
    out = prune("--finished-before", (T0 + 5 * DAY).isoformat(), "--archive", str(archive))
    assert "runs: 5 archived" in out, out
    assert run_ids() == set(history["new"] + history["unfinished"])
    for model in (Step, Approval, Event):
        assert not model.objects.filter(run_id__in=history["old"]).exists()
    assert not Notification.objects.filter(approval__run_id__in=history["old"]).exists()
    assert RunCreation.objects.count() == creations  # the global chain keeps every entry
    (pruning,) = Pruning.objects.all()
    assert (pruning.runs, pruning.first_run_id, pruning.last_run_id) == (
        5, history["old"][0], history["old"][-1])
    assert pruning.checkpoint_seq == AuditCheckpoint.objects.get().seq
    assert sorted(PrunedRun.objects.values_list("run_id", flat=True)) == history["old"]
    # The files: private, whole, the digest on record, every run with all it owned.
    assert stat.S_IMODE(archive.stat().st_mode) == 0o700
    path = archive / pruning.archive
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((archive / "checkpoint-00000001.json").stat().st_mode) == 0o600
    digest, header, records = archive_load(path)
    assert digest == pruning.archive_sha256 and header["pruning"] == 1
    assert [r["run"]["id"] for r in records] == history["old"]
    gated = records[3]
    assert [a["decided_by"] for a in gated["approvals"]] == ["alice"]
    assert gated["notifications"] and gated["notifications"][0]["attempts"][0]["ok"]
    assert sum(len(r["events"]) for r in records) == pruning.events
    assert not list(archive.glob(".*.tmp"))
    # The audit holds: the database alone, and the archived runs against it.
    assert verifyaudit().startswith("ok: 3 runs verified")
    assert "1 prunings' archives verified (5 archived runs)" in verifyaudit("--archive",
                                                                            str(archive))
    with pytest.raises(CommandError, match="archived and removed by pruning #1"):
        call_command("verifyaudit", "--run", str(history["old"][0]))


def test_pruning_twice_is_harmless(history, tmp_path):
    archive = tmp_path / "archive"
    before = (T0 + 5 * DAY).isoformat()
    prune("--finished-before", before, "--archive", str(archive), "--batch", "2")
    assert list(Pruning.objects.values_list("runs", flat=True)) == [2, 2, 1]
    out = prune("--finished-before", before, "--archive", str(archive))
    assert "runs: 0 archived" in out and "no pruning" in out
    assert Pruning.objects.count() == 3 and AuditCheckpoint.objects.count() == 2
    # A later date takes the newer finished run too, into the same directory; then nothing.
    prune("--finished-before", datetime.now(UTC).isoformat(), "--archive", str(archive))
    prune("--finished-before", datetime.now(UTC).isoformat(), "--archive", str(archive))
    assert run_ids() == set(history["unfinished"])
    assert Pruning.objects.count() == 4
    assert "4 prunings' archives verified (6 archived runs)" in verifyaudit("--archive",
                                                                            str(archive))


def test_a_run_with_a_notification_still_to_deliver_waits(history, tmp_path):
    gated = history["old"][3]
    Notification.objects.filter(approval__run_id=gated).update(status="pending")
    out = prune("--finished-before", (T0 + 5 * DAY).isoformat(), "--archive",
                str(tmp_path / "a"))
    assert "runs: 4 archived" in out and "1 finished run(s) kept" in out
    assert gated in run_ids()
    delivered(gated)
    Notification.objects.filter(approval__run_id=gated).update(status="delivered")
    prune("--finished-before", (T0 + 5 * DAY).isoformat(), "--archive", str(tmp_path / "a"))
    assert gated not in run_ids()
    assert verifyaudit("--archive", str(tmp_path / "a")).startswith("ok")


def test_a_run_that_does_not_verify_is_left_in_place(history, tmp_path):
    victim = history["old"][1]
    with connection.cursor() as cur:  # a row edited behind the runtime's back
        cur.execute("UPDATE runtime_step SET result = %s WHERE run_id = %s AND \"index\" = 2",
                    ['{"charged": 3000}', victim])
    out = io.StringIO()
    call_command("prune", "--finished-before", (T0 + 5 * DAY).isoformat(), "--archive",
                 str(tmp_path / "a"), stdout=out, stderr=out)
    assert f"left in place because they do not verify (run verifyaudit): [{victim}]" in \
        out.getvalue()
    assert victim in run_ids() and Pruning.objects.get().runs == 4
    assert f"run {victim} step 2: result" in broken("--archive", str(tmp_path / "a"))


# -- the triggers ---------------------------------------------------------------------------

def test_the_triggers_let_only_the_prune_through(history, tmp_path):
    prune("--finished-before", (T0 + 5 * DAY).isoformat(), "--archive", str(tmp_path / "a"))
    live = history["new"][0]
    refused = [
        "DELETE FROM runtime_event WHERE run_id = %s",
        "UPDATE runtime_event SET actor = 'mallory' WHERE run_id = %s",
        "DELETE FROM runtime_runcreation WHERE run_id = %s",
        "UPDATE runtime_runcreation SET agent = 'x' WHERE run_id = %s",
        "DELETE FROM runtime_auditcheckpoint WHERE seq <> %s",
        "DELETE FROM runtime_pruning WHERE seq <> %s",
        "UPDATE runtime_pruning SET runs = 0 WHERE seq <> %s",
        "DELETE FROM runtime_prunedrun WHERE run_id <> %s",
        "UPDATE runtime_prunedrun SET event_seq = 0 WHERE run_id <> %s",
    ]
    for sql in refused:
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), \
                connection.cursor() as cur:
            cur.execute(sql, [live])
    if connection.vendor == "postgresql":
        for table in ("runtime_event", "runtime_pruning", "runtime_prunedrun"):
            with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), \
                    connection.cursor() as cur:
                cur.execute(f"TRUNCATE {table} CASCADE")
    # An UPDATE of a pruned run's permit row, or of an event, is refused even mid-prune.
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), \
            connection.cursor() as cur:
        cur.execute("INSERT INTO runtime_prunedrun (run_id, pruning_seq, event_seq, event_hash)"
                    " VALUES (%s, 99, 1, 'x')", [live])
        cur.execute("UPDATE runtime_event SET actor = 'mallory' WHERE run_id = %s", [live])
    assert verifyaudit().startswith("ok")
    # The permit is the only way past, and it is a record that stays: forging one for a live
    # run lets its events go, and verifyaudit names both the forged entry and the missing run.
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("INSERT INTO runtime_prunedrun (run_id, pruning_seq, event_seq, event_hash)"
                    " VALUES (%s, 99, 1, 'x')", [live])
        cur.execute("DELETE FROM runtime_event WHERE run_id = %s", [live])
    problems = broken()
    assert f"runs [{live}] are entered as pruned by #99, which is not on record" in problems
    assert f"runs [{live}] are entered as pruned but still in the database" in problems
    assert f"run {live}: BROKEN" in problems


def test_a_run_deleted_by_hand_is_still_caught(history, tmp_path):
    from tests.runtime.test_audit_anchors import drop_triggers

    prune("--finished-before", (T0 + 5 * DAY).isoformat(), "--archive", str(tmp_path / "a"))
    victim = history["new"][0]
    drop_triggers()
    with connection.cursor() as cur:
        for table in ("runtime_event", "runtime_step", "runtime_approval"):
            cur.execute(f"DELETE FROM {table} WHERE run_id = %s", [victim])
        cur.execute("DELETE FROM runtime_run WHERE id = %s", [victim])
    assert f"run {victim} was deleted: the global chain records its creation" in broken()


# -- verifyaudit --archive finds what was changed -------------------------------------------

def test_verifyaudit_archive_finds_an_altered_or_missing_file(history, tmp_path):
    archive = tmp_path / "archive"
    prune("--finished-before", (T0 + 5 * DAY).isoformat(), "--archive", str(archive))
    path = archive / archive_name(1)
    text = path.read_text()
    path.write_text(text.replace('"charged":3', '"charged":3000', 1))
    assert "the file's SHA-256 is not the one on record" in broken("--archive", str(archive))
    path.unlink()
    assert f"its archive {path.name} is in none of" in broken("--archive", str(archive))
    path.write_text(text)
    assert verifyaudit("--archive", str(archive)).startswith("ok")
    cp = archive / "checkpoint-00000001.json"
    doc = json.loads(cp.read_text())
    doc["heads"][0][2] = "0" * 64
    cp.write_text(json.dumps(doc))
    assert "the signature does not match" in broken("--archive", str(archive))


def test_the_record_of_prunings_cannot_be_quietly_changed(history, tmp_path):
    from tests.runtime.test_audit_anchors import tampering

    prune("--finished-before", (T0 + 5 * DAY).isoformat(), "--archive", str(tmp_path / "a"))
    victim = history["old"][0]
    entry = PrunedRun.objects.filter(run_id=victim).values_list(
        "run_id", "pruning_seq", "event_seq", "event_hash").get()
    with tampering(), connection.cursor() as cur:
        cur.execute("DELETE FROM runtime_prunedrun WHERE run_id = %s", [victim])
    problems = broken()
    assert f"run {victim} was deleted: the global chain records its creation" in problems
    assert "pruning #1: its runs on record (4) are not the 5 it removed" in problems
    with tampering(), connection.cursor() as cur:
        cur.execute("INSERT INTO runtime_prunedrun (run_id, pruning_seq, event_seq, "
                    "event_hash) VALUES (%s, %s, %s, %s)", list(entry))
        cur.execute("UPDATE runtime_pruning SET by = 'someone else'")
    assert "prunings: record #1 does not hash after the one before" in broken()


def test_an_archive_on_no_record_is_replaced_only_when_its_runs_are_here(history, tmp_path):
    first, other = tmp_path / "first", tmp_path / "other"
    prune("--finished-before", (T0 + 5 * DAY).isoformat(), "--archive", str(first))
    # A file named as the next pruning's, holding runs this database no longer has (as after
    # a restore from a backup older than the prune that wrote it): it is not overwritten.
    other.mkdir()
    (other / archive_name(2)).write_bytes((first / archive_name(1)).read_bytes())
    later = datetime.now(UTC).isoformat()
    with pytest.raises(CommandError, match="holds runs that are not in this database"):
        prune("--finished-before", later, "--archive", str(other))
    (other / archive_name(2)).write_text("not an archive\n")
    with pytest.raises(CommandError, match="is in the way"):
        prune("--finished-before", later, "--archive", str(other))
    assert Pruning.objects.count() == 1 and history["new"][0] in run_ids()
    # Nor is a signed checkpoint of the number this database would give its next one.
    checkpoints = AuditCheckpoint.objects.count()
    (other / archive_name(2)).unlink()
    (first / f"checkpoint-{checkpoints + 1:08d}.json").write_text("{}")
    with pytest.raises(CommandError, match="exists: the directory holds another database's"):
        prune("--finished-before", later, "--archive", str(first))
    assert AuditCheckpoint.objects.count() == checkpoints


def test_an_older_checkpoint_still_holds_after_a_prune(history, tmp_path):
    early = tmp_path / "early.json"
    call_command("auditcheckpoint", "--out", str(early), stderr=io.StringIO())
    prune("--finished-before", (T0 + 5 * DAY).isoformat(), "--archive", str(tmp_path / "a"))
    assert "checkpoint #1 holds" in verifyaudit("--checkpoint", str(early))


# -- crashes ------------------------------------------------------------------------------

def test_a_crash_after_the_archive_loses_nothing(history, tmp_path, crash):
    archive = tmp_path / "archive"
    crash(CrashPoint.AFTER_ARCHIVE_WRITTEN)
    with pytest.raises(SimulatedCrash):
        runs_prune(finished_before=T0 + 5 * DAY, directory=archive, by="ops",
                   now=datetime.now(UTC))
    assert set(history["old"]) <= run_ids() and not Pruning.objects.exists()
    assert (archive / archive_name(1)).exists()  # written, on no record
    out = verifyaudit("--archive", str(archive))
    assert out.startswith("note: ") and "is on no pruning's record" in out
    from runtime import crashpoints
    crashpoints.disarm()
    prune("--finished-before", (T0 + 5 * DAY).isoformat(), "--archive", str(archive))
    assert not set(history["old"]) & run_ids()
    assert verifyaudit("--archive", str(archive)).startswith("ok")


@pytest.mark.slow
@pytest.mark.parametrize("point", [CrashPoint.AFTER_ARCHIVE_WRITTEN,
                                   CrashPoint.IN_PRUNE_TRANSACTION])
def test_a_prune_killed_half_way_loses_nothing_and_the_next_one_finishes(
        history, database, tmp_path, point):
    archive = tmp_path / "archive"
    reached = tmp_path / "reached.jsonl"
    killed = manage(database.url, "prune", "--finished-before", (T0 + 5 * DAY).isoformat(),
                    "--archive", str(archive), "--batch", "2",
                    env={"RUNTIME_CRASH_POINTS": json.dumps([{"point": str(point),
                                                             "occurrence": 2}]),
                         "RUNTIME_CRASH_REACHED_FILE": str(reached)})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert json.loads(reached.read_text())["detail"] == {"pruning": 2}
    # The first batch is whole and on record; the second is still in the database.
    assert list(Pruning.objects.values_list("seq", flat=True)) == [1]
    assert set(history["old"][2:]) <= run_ids()
    # Its archive was written (before the transaction that died): on no record, and harmless.
    assert verifyaudit("--archive", str(archive)).count("note: ") == 1
    done = manage(database.url, "prune", "--finished-before", (T0 + 5 * DAY).isoformat(),
                  "--archive", str(archive), "--batch", "2")
    assert done.returncode == 0, done.stderr
    assert not set(history["old"]) & run_ids()
    assert list(Pruning.objects.values_list("runs", flat=True)) == [2, 2, 1]
    assert verifyaudit("--archive", str(archive)).startswith("ok")


def manage(url: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "DATABASE_URL": url, "RUNTIME_AUDIT_KEY": KEY, **(env or {})}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=120)


# -- bad input changes nothing ---------------------------------------------------------------

def test_bad_input_is_refused_and_changes_nothing(history, tmp_path, settings):
    archive = tmp_path / "archive"
    date = (T0 + 5 * DAY).isoformat()
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = [
        ((), "nothing to prune"),
        (("--finished-before", date), "go together"),
        (("--archive", str(archive)), "go together"),
        (("--finished-before", "last tuesday", "--archive", str(archive)), "is not a date"),
        (("--finished-before", "2999-01-01", "--archive", str(archive)), "in the future"),
        (("--notifications-before", "2999-01-01"), "in the future"),
        (("--finished-before", date, "--archive", str(archive), "--batch", "0"), "--batch"),
        (("--finished-before", date, "--archive", str(a_file)), "not a directory"),
    ]
    if connection.vendor == "postgresql":
        cases.append((("--vacuum",), "--vacuum is for SQLite"))
    for args, message in cases:
        with pytest.raises(CommandError, match=message):
            prune(*args)
    settings.RUNTIME = {**settings.RUNTIME, "AUDIT_KEY": ""}
    with pytest.raises(CommandError, match=r"RUNTIME_AUDIT_KEY is not set.*--no-checkpoint"):
        prune("--finished-before", date, "--archive", str(archive))
    assert not archive.exists()
    assert not Pruning.objects.exists() and not AuditCheckpoint.objects.exists()
    assert verifyaudit().startswith("ok: 8 runs")
    # Without a key, on purpose: the archive is then proved against the database's record.
    out = prune("--finished-before", date, "--archive", str(archive), "--no-checkpoint")
    assert "no checkpoint" in out and Pruning.objects.get().checkpoint_seq is None
    assert verifyaudit("--archive", str(archive)).startswith("ok")


@pytest.mark.engines("postgres")
def test_the_application_role_cannot_prune(history, database, tmp_path, pg_admin):
    from tests.engines import unique_name
    from tests.runtime.test_audit_role import as_role

    role = unique_name("app").lower()
    pg_admin.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        call_command("auditrole", role, "--apply", stdout=io.StringIO())
        done = manage(as_role(database.url, role), "prune", "--finished-before",
                      (T0 + 5 * DAY).isoformat(), "--archive", str(tmp_path / "a"))
        assert done.returncode == 1
        assert f"the database role {role} may not delete events" in done.stderr
        assert not (tmp_path / "a").exists() and not AuditCheckpoint.objects.exists()
    finally:
        import psycopg

        with psycopg.connect(database.url, autocommit=True) as conn:
            conn.execute(f'REASSIGN OWNED BY "{role}" TO CURRENT_USER')
            conn.execute(f'DROP OWNED BY "{role}"')
        pg_admin.execute(f'DROP ROLE "{role}"')


# -- notifications, Idempotency-Key answers, API tokens ---------------------------------------

def test_old_notifications_go_with_their_attempts(history, settings):
    old_gated, waiting = history["old"][3], history["unfinished"][0]
    assert Notification.objects.filter(approval__run_id=waiting, status="pending").exists()
    kept = Notification.objects.filter(approval__run_id=waiting).count()
    going = Notification.objects.get(approval__run_id=old_gated)
    NotificationAttempt.objects.create(notification=going, number=0, at=going.created_at,
                                       ok=False, status_code=503)  # a failed try before
    out = prune("--notifications-before", (T0 + 20 * DAY).isoformat())
    assert "notifications: 1 removed" in out and "with 2 attempts" in out, out
    assert retired()[FAILED_ATTEMPTS] == 1  # the metrics' total keeps it
    assert not Notification.objects.filter(approval__run_id=old_gated).exists()
    assert not NotificationAttempt.objects.exists()
    assert Notification.objects.filter(approval__run_id=waiting).count() == kept  # pending
    delivered(waiting)
    with pytest.raises(CommandError, match="nothing to prune"):
        prune()
    settings.RUNTIME = {**settings.RUNTIME, "RETAIN_NOTIFICATIONS_DAYS": 1}
    assert "notifications: 1 removed" in prune()  # the setting's cutoff: a day ago
    assert not Notification.objects.exists()
    assert verifyaudit().startswith("ok: 8 runs")


def test_retired_totals_add_up(database):
    retire_in_tx({"lease_takeovers": 2, "decisions:approve": 0})
    retire_in_tx({"lease_takeovers": 3, "decision_seconds:approve": 1.5})
    assert retired() == {"lease_takeovers": 5.0, "decision_seconds:approve": 1.5}


def test_pruneapi_removes_old_answers_and_idle_tokens(database, monkeypatch):
    from django.contrib.auth import get_user_model

    from console.models import ApiToken, IdempotentRequest

    now = datetime.now(UTC)
    user = get_user_model().objects.create_user("ops")

    def token(name: str, **times) -> None:
        row = ApiToken(user=user, name=name)
        row.set_new_token()
        row.save()
        ApiToken.objects.filter(pk=row.pk).update(**times)

    token("idle", created_at=now - 100 * DAY, last_used_at=now - 95 * DAY)
    token("never-used", created_at=now - 100 * DAY)
    token("in-use", created_at=now - 100 * DAY, last_used_at=now - DAY)
    token("just-revoked", created_at=now - 100 * DAY, revoked_at=now - DAY)
    token("new", created_at=now - DAY)
    for key, age, status in (("old", 40 * DAY, 200), ("recent", DAY, 200),
                             ("answering", timedelta(seconds=5), 0)):
        row = IdempotentRequest.objects.create(user=user, key=key, method_path="POST /api/x",
                                               request_digest="d", status=status)
        IdempotentRequest.objects.filter(pk=row.pk).update(created_at=now - age)
    with pytest.raises(CommandError, match="nothing to prune"):
        call_command("pruneapi")
    with pytest.raises(CommandError, match="in the future"):
        call_command("pruneapi", "--tokens-unused-since", "2999-01-01")
    out = io.StringIO()
    call_command("pruneapi", "--idempotency-before", "30d", "--tokens-unused-since", "90d",
                 stdout=out)
    assert "idempotency answers: 1 removed" in out.getvalue()
    assert "API tokens: 2 removed" in out.getvalue()
    assert set(ApiToken.objects.values_list("name", flat=True)) == {"in-use", "just-revoked",
                                                                    "new"}
    assert set(IdempotentRequest.objects.values_list("key", flat=True)) == {"recent",
                                                                            "answering"}
    # The settings' defaults; an answer still being given is never taken, however far back.
    monkeypatch.setenv("CONSOLE_RETAIN_IDEMPOTENCY_DAYS", "0")
    monkeypatch.setenv("CONSOLE_RETAIN_API_TOKENS_DAYS", "x")
    with pytest.raises(CommandError, match="CONSOLE_RETAIN_API_TOKENS_DAYS must be"):
        call_command("pruneapi")
    monkeypatch.setenv("CONSOLE_RETAIN_API_TOKENS_DAYS", "0")
    call_command("pruneapi", "--idempotency-before", now.isoformat(), stdout=io.StringIO())
    assert list(IdempotentRequest.objects.values_list("key", flat=True)) == ["answering"]


# -- SQLite's free pages ---------------------------------------------------------------------

@pytest.mark.engines("sqlite")
def test_vacuum_gives_the_free_pages_back(sqlite_path, tmp_path, clock):
    ledger = Ledger(tmp_path / "ledger")
    agent = make_agent("big", [ToolCall("read", {"key": "a"}), FinalAnswer("ok")], ledger)

    def fill(n: int) -> None:
        with registry.override(agent):
            for i in range(n):
                resume(start("big", {"blob": f"{i}" + "x" * 60_000}, clock=clock).pk,
                       clock=clock, lease_seconds=5)

    def size() -> int:
        return sum(p.stat().st_size for p in (sqlite_path, Path(f"{sqlite_path}-wal"))
                   if p.exists())

    fill(40)
    full = size()
    prune("--finished-before", datetime.now(UTC).isoformat(), "--archive", str(tmp_path / "a"))
    out = prune("--vacuum")
    assert "reclaimed (vacuum)" in out
    first = size()
    assert first < full - 2_000_000, (full, first)
    with connection.cursor() as cur:
        cur.execute("PRAGMA auto_vacuum")
        assert cur.fetchone()[0] == 2  # incremental from now on
    fill(40)
    refilled = size()
    prune("--finished-before", datetime.now(UTC).isoformat(), "--archive", str(tmp_path / "a"),
          "--vacuum")
    assert size() < refilled - 2_000_000, (refilled, size())
    with connection.cursor() as cur:
        cur.execute("PRAGMA freelist_count")
        assert cur.fetchone()[0] == 0
    assert verifyaudit("--archive", str(tmp_path / "a")).startswith("ok: 0 runs")
    print(f"\nSQLite file with 40 finished runs of 60 KB: {full:,} bytes; pruned and vacuumed: "
          f"{first:,}; 40 more: {refilled:,}; pruned, incremental vacuum: {size():,}")


# -- while workers run ------------------------------------------------------------------------

@pytest.mark.slow
def test_prune_while_two_workers_run_200_runs(database, tmp_path, spawn):
    """Two real workers run 200 runs (five reads each, or a read, a charge and a read) while
    prunes archive and remove whatever has finished, batch after batch: no step fails, the
    outside world saw every call exactly once, and the whole record proves out afterwards."""
    from runtime.models import TERMINAL_RUN_STATUSES
    from tests import agents

    archive = tmp_path / "archive"
    workers = [spawn("--concurrency", "4", "--poll-interval", "0.05", tag=f"w{i}")
               for i in range(2)]
    with registry.override(*agents.AGENTS):
        ids = [start("mixed" if i % 4 == 0 else "steps5", {"i": i}).pk for i in range(200)]
    finished = Run.objects.filter(status__in=TERMINAL_RUN_STATUSES)
    rounds: list[tuple[int, int]] = []  # (runs unfinished as the prune began, runs it removed)
    while Run.objects.exists():
        wait_until(finished.exists, "a finished run to prune", timeout=120)
        unfinished = Run.objects.exclude(status__in=TERMINAL_RUN_STATUSES).count()
        done = runs_prune(finished_before=datetime.now(UTC), directory=archive, by="ops",
                          now=datetime.now(UTC), batch=25)
        assert not done.broken
        rounds.append((unfinished, done.runs))
    assert all(w.proc.poll() is None for w in workers), "a worker stopped"
    assert any(busy and removed for busy, removed in rounds), rounds  # pruned mid-flight
    assert sorted(PrunedRun.objects.values_list("run_id", flat=True)) == ids
    # No step failed, and each call reached the outside world exactly once.
    records = [r for p in sorted(archive.glob("prune-*.jsonl")) for r in archive_load(p)[2]]
    assert sorted(r["run"]["id"] for r in records) == ids
    assert {r["run"]["status"] for r in records} == {"succeeded"}
    assert {s["status"] for r in records for s in r["steps"]} == {"succeeded"}
    ledger = Ledger(tmp_path / "ledger.jsonl")
    assert (ledger.count("noop"), ledger.count("fast_charge")) == (150 * 5 + 50 * 2, 50)
    assert {c["pid"] for c in ledger.calls()} == {w.pid for w in workers}  # both worked
    assert verifyaudit().startswith("ok: 0 runs verified")
    assert f"{Pruning.objects.count()} prunings' archives verified (200 archived runs)" in \
        verifyaudit("--archive", str(archive))
    # Workers still take new runs; the events of a live run cannot be deleted.
    with registry.override(*agents.AGENTS):
        live = start("final", {}).pk
    wait_until(lambda: Run.objects.get(pk=live).status == "succeeded", "a new run to finish")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), \
            connection.cursor() as cur:
        cur.execute("DELETE FROM runtime_event WHERE run_id = %s", [live])
    if database.is_sqlite:  # the free pages go back, the workers still running
        from runtime.retention.space import sqlite_reclaim

        done = sqlite_reclaim()
        assert done.mode == "vacuum" and done.checkpointed
        assert done.after < done.before / 2, done
        assert database.path.stat().st_size <= done.after
        print(f"\n200 runs pruned in {len(rounds)} prunes with two workers running; the SQLite "
              f"file with its WAL: {done.before:,} bytes before the vacuum, {done.after:,} after")
    assert verifyaudit().startswith("ok: 1 runs verified")
