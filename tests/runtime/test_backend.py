"""The SQLite backend's writer queue: write transactions take an exclusive flock first, so a
waiting writer sleeps in the kernel and goes the moment the holder commits or rolls back."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import connection, connections, transaction

from runtime.backends.sqlite3.base import DatabaseWrapper
from runtime.models import Worker
from tests.kit import Background
from tests.procs import wait_until


def _writer_file(db: Path) -> Path:
    return Path(f"{db}.writer")


def _lock_is_free(db: Path) -> bool:
    """Try the writer lock on a descriptor of our own, without waiting."""
    fd = os.open(_writer_file(db), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops the lock if we got it
    return True


def _waiters(db: Path) -> int:
    """Processes or descriptors blocked on the writer lock (``->`` lines of /proc/locks)."""
    inode = os.stat(_writer_file(db)).st_ino
    return sum(1 for line in Path("/proc/locks").read_text().splitlines()
               if "->" in line and f":{inode} " in line + " ")


def _add_worker(owner: str) -> None:
    from django.utils import timezone

    now = timezone.now()
    Worker.objects.create(owner=owner, host="h", pid=1, boot_id="b", started_at=now,
                          heartbeat_at=now, concurrency=1, lease_seconds=30.0)


def _add_worker_in_tx() -> None:
    with transaction.atomic():
        _add_worker("after")


def test_the_project_uses_the_queued_backend_for_sqlite(rdb):
    assert isinstance(connections["default"], DatabaseWrapper)
    assert connections["default"].vendor == "sqlite"


def test_a_write_transaction_holds_the_lock_until_it_commits(rdb):
    assert _lock_is_free(rdb) or not _writer_file(rdb).exists()
    with transaction.atomic():
        _add_worker("a")
        assert not _lock_is_free(rdb)
    assert _lock_is_free(rdb)
    assert Worker.objects.filter(owner="a").exists()


def test_a_rolled_back_transaction_releases_the_lock_and_writes_nothing(rdb):
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        _add_worker("b")
        assert not _lock_is_free(rdb)
        1 / 0  # noqa: B018 - the failure inside the transaction
    assert _lock_is_free(rdb)
    assert not Worker.objects.exists()


def test_closing_the_connection_inside_a_transaction_releases_the_lock(rdb):
    connection.ensure_connection()
    connection.set_autocommit(True)
    connection._start_transaction_under_autocommit()
    assert not _lock_is_free(rdb)
    connection.close()
    assert _lock_is_free(rdb)


def test_a_second_writer_waits_in_the_kernel_and_goes_when_the_first_commits(rdb):
    holding, release = threading.Event(), threading.Event()

    def first() -> None:
        with transaction.atomic():
            _add_worker("first")
            holding.set()
            assert release.wait(30)

    def second() -> str:
        with transaction.atomic():
            _add_worker("second")
        return "done"

    a = Background(first)
    assert holding.wait(10)
    b = Background(second)
    wait_until(lambda: _waiters(rdb) == 1, what="the second writer to queue on the lock")
    assert b.result is None and not Worker.objects.filter(owner="second").exists()
    release.set()
    a.join()
    b.join()
    assert b.error is None and b.result == "done"
    assert set(Worker.objects.values_list("owner", flat=True)) == {"first", "second"}


def test_a_holder_that_is_killed_leaves_the_lock_to_the_next_writer(rdb, tmp_path):
    ready = tmp_path / "holding"
    script = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "open(sys.argv[2], 'w').close()\n"
        "time.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", script, str(_writer_file(rdb)), str(ready)])
    try:
        wait_until(ready.exists, what="the other process to hold the lock")
        assert not _lock_is_free(rdb)
        writer = Background(_add_worker_in_tx)
        wait_until(lambda: _waiters(rdb) == 1, what="our writer to queue behind it")
        holder.kill()
        holder.wait(10)
        writer.join()
        assert writer.error is None
        assert Worker.objects.filter(owner="after").exists()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)


def test_write_transaction_commits_what_runs_inside_and_releases_the_lock(rdb):
    with connection.write_transaction():
        _add_worker("lean")
        assert not _lock_is_free(rdb)
        assert connection.in_atomic_block is False  # no atomic() bookkeeping
    assert _lock_is_free(rdb)
    assert Worker.objects.filter(owner="lean").exists()


def test_write_transaction_rolls_back_on_any_exception_including_a_simulated_crash(rdb):
    from runtime.errors import SimulatedCrash

    for exc in (ValueError("bad"), SimulatedCrash("in_transaction", None, None)):
        with pytest.raises(type(exc)), connection.write_transaction():
            _add_worker(f"lost-{type(exc).__name__}")
            raise exc
        assert _lock_is_free(rdb)
    assert not Worker.objects.exists()
    with connection.write_transaction():  # the connection is usable afterwards
        _add_worker("next")
    assert list(Worker.objects.values_list("owner", flat=True)) == ["next"]


def test_write_transaction_is_refused_inside_an_atomic_block(rdb):
    with transaction.atomic():
        with pytest.raises(transaction.TransactionManagementError), \
                connection.write_transaction():
            pass
        _add_worker("outer")
    assert Worker.objects.filter(owner="outer").exists()
