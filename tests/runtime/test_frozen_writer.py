"""A process frozen (SIGSTOP) while it holds what SQLite's writers wait for.

Holding the writer queue's flock alone, it is passed within the patience (a quarter of the
lease): the others log one line naming it and write through SQLite's own lock, so it delays
another worker's takeover of a run by no more than one lease. Holding SQLite's own write lock
too (frozen inside a write transaction), nobody can write until it continues or dies, and
"database is locked" names it and says it is stopped.

The frozen process is a helper that takes the locks a worker would hold at that moment and
stops itself; the test ends it by its pid.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from runtime import start
from runtime.agents.agent import registry
from runtime.models import Event, Run, Worker
from runtime.storage.sqlite.base import writer_stats
from tests import agents
from tests.waiting import wait_until

# Takes the writer queue's flock and/or SQLite's write lock (BEGIN IMMEDIATE), says so on
# stdout, and stops itself.
FREEZE = """
import fcntl, os, signal, sqlite3, sys
db, queue, sqlite = sys.argv[1], sys.argv[2] == "queue", sys.argv[3] == "sqlite"
if queue:
    fd = os.open(db + ".writer", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
if sqlite:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2:].split()[0]


@pytest.fixture
def frozen() -> Iterator[Callable[..., subprocess.Popen]]:
    """Start a helper holding the queue and/or SQLite's lock, stopped; killed by its pid."""
    started: list[subprocess.Popen] = []

    def freeze(db: Path, *, queue: bool, sqlite: bool) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", FREEZE, str(db), "queue" if queue else "-",
             "sqlite" if sqlite else "-"], stdout=subprocess.PIPE, text=True)
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        wait_until(lambda: _state(proc.pid) == "T", what="the helper to stop")
        return proc

    yield freeze
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)  # a stopped process dies of SIGKILL too
        proc.wait(10)


@pytest.fixture
def short_lease(settings) -> float:
    """A 2 s lease: the patience is half a second."""
    settings.RUNTIME = {**settings.RUNTIME, "LEASE_SECONDS": 2.0}
    return 2.0


def _add_worker(owner: str) -> None:
    now = timezone.now()
    Worker.objects.create(owner=owner, host="h", pid=1, started_at=now, heartbeat_at=now)


def _passed_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "passed" in r.getMessage()]


def test_a_stopped_holder_of_the_queue_is_passed_with_one_line_naming_it(
        sqlite_path, short_lease, frozen, caplog):
    caplog.set_level(logging.INFO, logger="runtime.store")
    helper = frozen(sqlite_path, queue=True, sqlite=False)
    before = writer_stats().passed
    with transaction.atomic():
        _add_worker("first")  # waits the patience, then passes
    with connection.write_transaction():
        _add_worker("second")  # passes at once: the same process, still not moving
    assert writer_stats().passed == before + 2
    [line] = _passed_lines(caplog)
    assert f"pid {helper.pid} (stopped) has held it" in line
    assert f"{sqlite_path}.writer" in line and "SQLite's own lock" in line

    os.kill(helper.pid, signal.SIGCONT)  # it goes on, exits, and the queue is free again
    helper.wait(10)
    with transaction.atomic():
        _add_worker("third")
    assert writer_stats().passed == before + 2  # through the queue, as before the freeze
    assert set(Worker.objects.values_list("owner", flat=True)) == {"first", "second", "third"}


@pytest.mark.parametrize("queue", [False, True], ids=["sqlite lock", "queue and sqlite lock"])
def test_database_is_locked_names_a_stopped_holder_of_sqlites_write_lock(
        sqlite_path, short_lease, frozen, monkeypatch, queue):
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "timeout", 0.3)
    helper = frozen(sqlite_path, queue=queue, sqlite=True)
    said = (rf"^database is locked: pid {helper.pid} holds SQLite's write lock and has not "
            rf"moved for \d+\.\d s \(stopped\): nobody can write until it continues or dies$")
    for begin in (connection.write_transaction, transaction.atomic):
        with pytest.raises(OperationalError, match=said), begin():
            _add_worker("never")
    os.kill(helper.pid, signal.SIGKILL)
    helper.wait(10)
    with transaction.atomic():  # the kernel let both locks go with the process
        _add_worker("later")
    assert list(Worker.objects.values_list("owner", flat=True)) == ["later"]


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value)


@pytest.mark.slow
def test_a_frozen_holder_of_the_queue_delays_a_takeover_by_no_more_than_one_lease(
        sqlite_path, tmp_path, spawn, frozen):
    """A worker holding a run is frozen, and so is the holder of the writer queue: the run's
    lease lapses and the other worker takes it over within one lease of the expiry, while
    the queue is still held by the stopped process."""
    lease = 3.0
    env = {"RUNTIME_LEASE_SECONDS": str(lease)}
    with registry.override(*agents.AGENTS):
        run = start("slow", {})
    first = spawn("--name", "first", env=env)
    wait_until(lambda: (tmp_path / f"entered-slow_read-{run.pk}-1").exists(),
               what="the tool to start")
    second = spawn("--name", "second", env=env)
    wait_until(lambda: Worker.objects.filter(name="second").exists(), what="second to start")
    helper = frozen(sqlite_path, queue=True, sqlite=False)
    first.signal(signal.SIGSTOP)
    try:
        (tmp_path / "release-slow_read").touch()  # the read, taken over, finishes at once
        wait_until(lambda: Run.objects.get(pk=run.pk).status == "succeeded", timeout=60,
                   what="the takeover")
        assert _state(helper.pid) == "T"  # the queue's holder never moved meanwhile
        taken = Event.objects.get(run_id=run.pk, kind="lease.taken_over")
        assert taken.actor.startswith("second@")
        delay = (taken.at - _at(taken.payload["previous_expires_at"])).total_seconds()
        assert 0 <= delay <= lease, delay
        out = second.output()
        passed = [line for line in out.splitlines() if "passed" in line]
        assert len(passed) == 1 and f"pid {helper.pid} (stopped)" in passed[0], out
    finally:
        first.kill()  # SIGKILL ends a stopped process too
    second.signal(signal.SIGTERM)
    assert second.wait() == 0, second.output()
