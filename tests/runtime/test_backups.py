"""``manage.py backup`` and ``restore`` with real workers, on both engines: a restore from a
backup taken at a random moment never repeats a side effect without a person's decision, and a
call repeated after an approval carries the first call's idempotency key. Side-effect counts
come from the outside world's ledger."""

from __future__ import annotations

import io
import os
import random
import sqlite3
import stat
from collections import Counter
from contextlib import contextmanager

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from runtime import start
from runtime.agents.agent import registry
from runtime.approvals.decisions import approve
from runtime.audit.check import audit_check
from runtime.backups import operations
from runtime.backups.copy import copy_in
from runtime.backups.operations import backup_restore, backup_take
from runtime.clock import SYSTEM_CLOCK
from runtime.models import Backup, Restoration, Run, Worker
from runtime.selectors.approvals import pending
from tests import agents
from tests.kit import Ledger
from tests.waiting import wait_until

pytestmark = pytest.mark.engines

SIDE_EFFECTS = ("fast_charge", "notify")
KEY = "k" * 40


@contextmanager
def _agents():
    with registry.override(*agents.AGENTS):
        yield


def _effects(ledger: Ledger) -> list[dict]:
    return [c for c in ledger.calls() if c["call"] in SIDE_EFFECTS]


def _statuses() -> Counter:
    return Counter(Run.objects.values_list("status", flat=True))


@pytest.mark.slow
def test_a_restore_repeats_no_side_effect_without_a_person(database, tmp_path, spawn):
    seed = int(os.environ.get("RESTORE_SEED", random.randrange(10**6)))
    rng = random.Random(seed)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    with _agents():
        runs = [start("paynotify", {"i": i}) for i in range(30)]
    slow = {"RUNTIME_TEST_TOOL_SECONDS": "0.05"}  # so that backups land while runs are under way
    workers = [spawn("--burst", "--concurrency", "2", env=slow) for _ in range(2)]
    backups = []
    # Two backups at random moments while the runs are under way (of 120 calls in all).
    for n, mark in enumerate(sorted(rng.sample(range(5, 80), 2))):
        wait_until(lambda mark=mark: ledger.count() >= mark, what=f"{mark} calls", timeout=120)
        backups.append(backup_take(tmp_path / f"backup-{n}", by="ops", now=SYSTEM_CLOCK.now()))
    for worker in workers:
        assert worker.wait(120) == 0, worker.output()
    assert _statuses() == {"succeeded": len(runs)}, f"seed {seed}"
    first_calls = {(c["run"], c["step"]): c for c in _effects(ledger)}
    assert len(first_calls) == 3 * len(runs)

    chosen = rng.choice(backups)
    restoration = backup_restore(chosen.path, by="ops", now=SYSTEM_CLOCK.now())
    unfinished = Run.objects.exclude(status__in=["succeeded", "failed", "cancelled"])
    assert restoration.runs_held == unfinished.count() > 0, f"seed {seed}"
    assert restoration.backup_taken_at == chosen.taken_at

    for worker in [spawn("--burst"), spawn("--burst")]:
        assert worker.wait(120) == 0, worker.output()
    # Not one side effect ran again on its own: every held run waits for a person.
    assert len(_effects(ledger)) == len(first_calls), f"seed {seed}"
    held = pending()  # (a run held after its last side effect finishes without asking)
    assert 0 < len(held) <= restoration.runs_held, f"seed {seed}"
    assert {a.kind for a in held} == {"restored"}
    stamp = f"{chosen.taken_at:%Y-%m-%d %H:%M:%S} UTC"
    assert all(stamp in a.title and stamp in a.detail for a in held)
    assert _statuses()["waiting"] == len(held)

    for a in held:  # a person lets each held call run once more
        approve(a.pk, by="olga")
    for worker in [spawn("--burst")]:
        assert worker.wait(120) == 0, worker.output()
    repeats = _effects(ledger)[len(first_calls):]
    assert len(repeats) == len(held), f"seed {seed}"  # exactly the approved calls
    for call in repeats:  # ...each with the key its first call carried, if it had one
        first = first_calls.get((call["run"], call["step"]))
        if first is not None:
            assert call["key"] == first["key"], f"seed {seed}"
    assert all(a.kind == "restored" for a in pending())  # each next side effect asks again
    assert not audit_check(report=lambda line: None).problems


def test_a_backup_is_whole_private_and_carries_its_own_checkpoint(database, tmp_path, settings,
                                                                 capsys):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    settings.RUNTIME = {**settings.RUNTIME, "AUDIT_KEY": KEY, "CHECKPOINT_DIR": str(directory)}
    with _agents():
        start("steps5", {})
    target = tmp_path / "nightly.backup"
    call_command("backup", str(target), "--by", "ops")
    assert "written to" in capsys.readouterr().out
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    side = tmp_path / "nightly.backup.checkpoint.json"
    assert stat.S_IMODE(side.stat().st_mode) == 0o600
    assert len(list(directory.iterdir())) == 1
    row = Backup.objects.get()
    assert (row.by, row.path) == ("ops", str(target))
    if database.path is not None:  # the copy is a SQLite database holding its own moment
        copy = sqlite3.connect(target)
        try:
            assert copy.execute("SELECT count(*) FROM runtime_backup").fetchone() == (1,)
            assert copy.execute("SELECT count(*) FROM runtime_run").fetchone() == (1,)
        finally:
            copy.close()
    call_command("verifyaudit", "--checkpoint", str(side))


def test_bad_backups_and_bad_moments_are_refused_and_change_nothing(database, tmp_path):
    with _agents():
        run = start("steps5", {})
    not_a_backup = tmp_path / "notes.txt"
    not_a_backup.write_text("hello")
    for argv, message in (
            ([str(tmp_path / "missing")], "no such backup file"),
            ([], "give the backup file, or --acknowledge"),
            (["--acknowledge", "--taken-at", "yesterday"], "is not a date"),
            (["--acknowledge", "--taken-at", "2999-01-01"], "in the future"),
            (["--acknowledge", "--taken-at", "999999d"], "further back than any date"),
            (["--acknowledge"], "records no backup"),
            (["x", "--acknowledge"], "give the backup file, or --acknowledge")):
        with pytest.raises(CommandError, match=message):
            call_command("restore", *argv)
    with pytest.raises(CommandError, match=r"not a SQLite database|damaged|not a pg_dump"):
        call_command("restore", str(not_a_backup))
    with pytest.raises(CommandError, match="is a directory"):
        call_command("backup", str(tmp_path))
    if database.path is not None:  # the live database and its companions are never targets
        for name in ("", "-wal", "-shm", ".writer"):
            with pytest.raises(CommandError, match="the live database"):
                call_command("backup", f"{database.path}{name}")
    assert not Restoration.objects.exists()
    assert Run.objects.get(pk=run.pk).restored_at is None


def test_a_restore_is_refused_while_a_worker_is_live(database, tmp_path):
    taken = backup_take(tmp_path / "b", by="ops", now=SYSTEM_CLOCK.now())
    now = SYSTEM_CLOCK.now()
    Worker.objects.create(owner="w@h:1:x", host="h", pid=1, started_at=now, heartbeat_at=now,
                          lease_seconds=30)
    with pytest.raises(CommandError, match=r"worker.* live.*stop every worker first"):
        call_command("restore", str(taken.path))
    assert not Restoration.objects.exists()


def test_a_worker_refuses_a_database_restored_by_hand_until_it_is_fenced(database, tmp_path,
                                                                         spawn, settings):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    key_env = {"RUNTIME_AUDIT_KEY": KEY, "RUNTIME_CHECKPOINT_DIR": str(directory)}
    settings.RUNTIME = {**settings.RUNTIME, "AUDIT_KEY": KEY, "CHECKPOINT_DIR": str(directory)}
    with _agents():
        run = start("mixed", {})
    taken = backup_take(tmp_path / "b", by="ops", now=SYSTEM_CLOCK.now())
    assert spawn("--burst", env=key_env).wait(60) == 0
    assert Run.objects.get(pk=run.pk).status == "succeeded"
    call_command("auditcheckpoint", "--out", str(directory / "later.checkpoint.json"))
    copy_in(taken.path)  # the old copy put back by hand, as after a disk died: no fence
    refused = spawn("--burst", env=key_env)
    assert refused.wait(60) != 0
    assert "behind the audit checkpoint" in refused.output()
    assert "manage.py restore --acknowledge" in refused.output()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    charges = ledger.count("fast_charge")
    call_command("restore", "--acknowledge", "--by", "ops")
    assert spawn("--burst", env=key_env).wait(60) == 0
    assert ledger.count("fast_charge") == charges  # held, not repeated
    (held,) = pending()
    assert held.kind == "restored" and held.run_id == run.pk


def test_a_restore_stopped_before_its_fence_keeps_workers_out_until_acknowledged(
        database, tmp_path, spawn, monkeypatch):
    with _agents():
        run = start("mixed", {})
    taken = backup_take(tmp_path / "b", by="ops", now=SYSTEM_CLOCK.now())
    assert spawn("--burst").wait(60) == 0
    assert Run.objects.get(pk=run.pk).status == "succeeded"

    def migrate_fails(*args, **kwargs):
        raise RuntimeError("the power went out")

    monkeypatch.setattr(operations, "call_command", migrate_fails)
    with pytest.raises(CommandError, match=r"not fenced \(the power went out\)"):
        call_command("restore", str(taken.path))
    monkeypatch.undo()
    assert Run.objects.get(pk=run.pk).status == "queued"  # the backup's data, not held
    refused = spawn("--burst")
    assert refused.wait(60) != 0
    assert "a restore of this database did not finish" in refused.output()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    charges = ledger.count("fast_charge")
    call_command("restore", "--acknowledge", "--by", "ops")
    assert spawn("--burst").wait(60) == 0
    assert ledger.count("fast_charge") == charges
    (held,) = pending()
    assert held.kind == "restored" and held.run_id == run.pk


def test_a_failed_copy_changes_nothing_and_leaves_no_mark(database, tmp_path, spawn):
    with _agents():
        run = start("mixed", {})
    broken = tmp_path / "broken.backup"
    broken.write_bytes(b"PGDMP" + b"\0" * 64 if database.path is None else b"x" * 4096)
    with pytest.raises(CommandError):
        call_command("restore", str(broken))
    assert Run.objects.get(pk=run.pk).status == "queued" and not Restoration.objects.exists()
    assert spawn("--burst").wait(60) == 0  # no mark left: workers start
    assert Run.objects.get(pk=run.pk).status == "succeeded"


def test_a_worker_says_what_is_missing_to_read_the_checkpoints(database, tmp_path, spawn,
                                                               settings):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    settings.RUNTIME = {**settings.RUNTIME, "AUDIT_KEY": KEY}
    call_command("auditcheckpoint", "--out", str(directory / "2026-01-01T000000.checkpoint.json"),
                 stderr=io.StringIO())
    worker = spawn("--burst", env={"RUNTIME_CHECKPOINT_DIR": str(directory),
                                   "RUNTIME_AUDIT_KEY": ""})
    assert worker.wait(60) != 0
    assert "RUNTIME_AUDIT_KEY is not set" in worker.output()
    assert "Traceback" not in worker.output()


def test_an_unreadable_newest_checkpoint_is_passed_over(database, tmp_path, settings, spawn):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    settings.RUNTIME = {**settings.RUNTIME, "AUDIT_KEY": KEY, "CHECKPOINT_DIR": str(directory)}
    call_command("auditcheckpoint", "--out", str(directory / "2026-01-01T000000.checkpoint.json"),
                 stderr=io.StringIO())
    (directory / "2026-01-02T000000.checkpoint.json").write_text("{not a checkpoint")
    worker = spawn("--burst", env={"RUNTIME_AUDIT_KEY": KEY,
                                   "RUNTIME_CHECKPOINT_DIR": str(directory)})
    assert worker.wait(60) == 0, worker.output()
    assert "2026-01-02T000000.checkpoint.json passed over" in worker.output()
