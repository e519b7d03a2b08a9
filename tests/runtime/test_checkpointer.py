"""runtime.storage.sqlite.checkpointer: a worker checkpoints the WAL from a thread of its own,
beside the writers rather than inside one of their commits, and keeps the WAL bounded."""

from __future__ import annotations

import re
import threading

import pytest
from django.db import connection

from runtime import start
from runtime.agents.agent import registry
from runtime.models import Run
from runtime.models import Worker as WorkerRow
from runtime.storage.sqlite.checkpointer import PASS_COMMITS, PASS_SECONDS, Checkpointer
from tests import agents
from tests.kit import Background

pytestmark = pytest.mark.engines("sqlite")  # the WAL is SQLite's


def _autocheckpoint() -> int:
    with connection.cursor() as cursor:
        return cursor.execute("PRAGMA wal_autocheckpoint").fetchone()[0]


def _on_a_new_thread(fn):
    job = Background(fn)
    job.thread.join(10)
    assert job.error is None
    return job.result


def _write(n: int, tag: str) -> None:
    WorkerRow.objects.bulk_create([
        WorkerRow(owner=f"{tag}-{i}", name="x" * 200, host="h", pid=i, boot_id="b",
                  proc_start=0, started_at="2026-01-01T00:00:00Z",
                  heartbeat_at="2026-01-01T00:00:00Z", concurrency=1, lease_seconds=1)
        for i in range(n)])


def test_connections_opened_while_it_runs_leave_checkpoints_to_it(sqlite_path):
    checkpointer = Checkpointer(interval=3600)  # ticks only when the test says
    checkpointer.start()
    try:
        assert _autocheckpoint() == 0  # this thread's connection, already open
        assert _on_a_new_thread(_autocheckpoint) == 0
    finally:
        checkpointer.stop()
    assert _on_a_new_thread(_autocheckpoint) == 1000  # SQLite's own again afterwards


def test_a_checkpoint_copies_the_wal_while_a_writer_holds_the_lock(sqlite_path):
    checkpointer = Checkpointer(interval=3600)
    checkpointer.start()
    try:
        for i in range(20):
            _write(100, f"w{i}")
        holding, release = threading.Event(), threading.Event()

        def writer() -> None:
            with connection.write_transaction():
                WorkerRow.objects.filter(owner="w0-0").update(name="held")
                holding.set()
                assert release.wait(10)

        job = Background(writer)
        assert holding.wait(10), job.error
        busy, wal, done = checkpointer.tick()  # neither waits for nor takes the write lock
        release.set()
        job.thread.join(10)
        assert job.error is None
        assert busy == 0 and wal > 20 and done == wal
    finally:
        checkpointer.stop()


def test_a_busy_workers_wal_stays_bounded(sqlite_path, tmp_path, spawn):
    """200 runs of five steps through one worker with eight in flight (about 100 MB of WAL
    pages written): its checkpointer keeps the WAL file to about what is written between two
    of its passes plus ``RESTART_PAGES`` (with passive checkpoints alone it grew to 68 MB)."""
    with registry.override(*agents.AGENTS):
        runs = [start("steps5", {"i": i}).pk for i in range(200)]
    worker = spawn("--burst", "--concurrency", "8")
    assert worker.wait(120) == 0, worker.output()
    assert set(Run.objects.filter(pk__in=runs).values_list("status", flat=True)) == {
        "succeeded"}
    wal = sqlite_path.with_name(sqlite_path.name + "-wal").stat().st_size
    found = re.search(r"checkpoints: (\d+) \((\d+) with the WAL started over\)",
                      worker.output())
    assert found is not None and int(found[2]) > 0, worker.output()[-2000:]
    assert wal < 16 * 1024 * 1024, f"WAL of {wal} bytes"


def test_passes_are_paced_by_this_processs_commits_not_by_the_clock(sqlite_path):
    """A pass that finds new pages syncs twice: a worker with one slow run in flight must not
    pay that on every tick for a page or two."""
    checkpointer = Checkpointer(interval=3600)
    start_at = checkpointer._last
    assert not checkpointer.due(now=start_at + 10 * PASS_SECONDS)  # nothing written: never
    _write(1, "one")
    assert not checkpointer.due(now=start_at + PASS_SECONDS / 2)  # one commit: not yet...
    assert checkpointer.due(now=start_at + PASS_SECONDS)  # ...but within PASS_SECONDS
    for i in range(PASS_COMMITS):
        _write(1, f"many{i}")
    assert checkpointer.due(now=start_at)  # enough commits: at once


def test_without_the_writer_queue_every_tick_is_due(sqlite_path):
    """Commits are counted by the writer queue: with it off, pacing by them would never pass
    and the WAL would grow without end."""
    options = connection.settings_dict["OPTIONS"]
    before = dict(options)
    options["writer_queue"] = False
    try:
        assert Checkpointer(interval=3600).due()
    finally:
        options.clear()
        options.update(before)
    assert not Checkpointer(interval=3600).due()  # with it, nothing written: not due
