"""The SQLite backend's writer queue: write transactions take an exclusive flock first, so a
waiting writer tries again within a millisecond of the holder's commit or rollback, and gives
up with "database is locked" after the connection's timeout."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest
from django.db import connection, connections, transaction
from django.db.utils import ConnectionHandler

from runtime.host import files
from runtime.models import Worker
from runtime.storage.sqlite.base import DatabaseWrapper
from tests.kit import Background
from tests.waiting import wait_until


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


@pytest.fixture
def busy_tries(monkeypatch) -> list[int]:
    """Counts the backend's tries that found the writer lock taken (each appends 1)."""
    import runtime.storage.sqlite.base as backend

    found: list[int] = []

    def flock(fd: int, op: int) -> None:
        try:
            fcntl.flock(fd, op)
        except BlockingIOError:
            found.append(1)
            raise

    monkeypatch.setattr(backend, "fcntl", types.SimpleNamespace(
        flock=flock, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB, LOCK_UN=fcntl.LOCK_UN))
    return found


def _add_worker(owner: str) -> None:
    from django.utils import timezone

    now = timezone.now()
    Worker.objects.create(owner=owner, host="h", pid=1, boot_id="b", started_at=now,
                          heartbeat_at=now, concurrency=1, lease_seconds=30.0)


def _add_worker_in_tx() -> None:
    with transaction.atomic():
        _add_worker("after")


def test_the_project_uses_the_queued_backend_for_sqlite(sqlite_path):
    assert isinstance(connections["default"], DatabaseWrapper)
    assert connections["default"].vendor == "sqlite"


def test_a_write_transaction_holds_the_lock_until_it_commits(sqlite_path):
    assert _lock_is_free(sqlite_path) or not _writer_file(sqlite_path).exists()
    with transaction.atomic():
        _add_worker("a")
        assert not _lock_is_free(sqlite_path)
    assert _lock_is_free(sqlite_path)
    assert Worker.objects.filter(owner="a").exists()


def test_a_rolled_back_transaction_releases_the_lock_and_writes_nothing(sqlite_path):
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        _add_worker("b")
        assert not _lock_is_free(sqlite_path)
        1 / 0  # noqa: B018 - the failure inside the transaction
    assert _lock_is_free(sqlite_path)
    assert not Worker.objects.exists()


def test_closing_the_connection_inside_a_transaction_releases_the_lock(sqlite_path):
    connection.ensure_connection()
    connection.set_autocommit(True)
    connection._start_transaction_under_autocommit()
    assert not _lock_is_free(sqlite_path)
    connection.close()
    assert _lock_is_free(sqlite_path)


class _WatchedLock:
    """This process's writer lock for a database, noting each acquire that had to wait."""

    def __init__(self) -> None:
        self.lock, self.waited = threading.Lock(), []

    def acquire(self, timeout: float = -1) -> bool:
        if self.lock.acquire(blocking=False):
            return True
        self.waited.append(1)
        return self.lock.acquire(timeout=timeout)

    def release(self) -> None:
        self.lock.release()


def test_a_second_writer_thread_waits_and_goes_when_the_first_commits(sqlite_path, monkeypatch):
    import runtime.storage.sqlite.base as backend

    watched = _WatchedLock()
    monkeypatch.setitem(backend._process_locks, os.path.abspath(f"{sqlite_path}.writer"), watched)
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
    wait_until(lambda: watched.waited, what="the second writer to find the lock taken")
    assert b.result is None and not Worker.objects.filter(owner="second").exists()
    release.set()
    a.join()
    b.join()
    assert b.error is None and b.result == "done"
    assert set(Worker.objects.values_list("owner", flat=True)) == {"first", "second"}


def test_a_holder_that_is_killed_leaves_the_lock_to_the_next_writer(
        sqlite_path, tmp_path, busy_tries):
    holder = _hold_in_another_process(sqlite_path, tmp_path / "holding")
    try:
        assert not _lock_is_free(sqlite_path)
        writer = Background(_add_worker_in_tx)
        wait_until(lambda: busy_tries, what="our writer to find the lock taken")
        holder.kill()
        holder.wait(10)
        writer.join()
        assert writer.error is None
        assert Worker.objects.filter(owner="after").exists()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)


def test_write_transaction_commits_what_runs_inside_and_releases_the_lock(sqlite_path):
    with connection.write_transaction():
        _add_worker("lean")
        assert not _lock_is_free(sqlite_path)
        assert connection.in_atomic_block is False  # no atomic() bookkeeping
    assert _lock_is_free(sqlite_path)
    assert Worker.objects.filter(owner="lean").exists()


def test_write_transaction_rolls_back_on_any_exception_including_a_simulated_crash(sqlite_path):
    from runtime.errors import SimulatedCrash

    for exc in (ValueError("bad"), SimulatedCrash("in_transaction", None, None)):
        with pytest.raises(type(exc)), connection.write_transaction():
            _add_worker(f"lost-{type(exc).__name__}")
            raise exc
        assert _lock_is_free(sqlite_path)
    assert not Worker.objects.exists()
    with connection.write_transaction():  # the connection is usable afterwards
        _add_worker("next")
    assert list(Worker.objects.values_list("owner", flat=True)) == ["next"]


def test_write_transaction_is_refused_inside_an_atomic_block(sqlite_path):
    with transaction.atomic():
        with pytest.raises(transaction.TransactionManagementError), \
                connection.write_transaction():
            pass
        _add_worker("outer")
    assert Worker.objects.filter(owner="outer").exists()


def _waiter_threads() -> int:
    return sum(t.name == "sqlite-writer-queue" for t in threading.enumerate())


def _hold_in_another_process(db: Path, ready: Path, *, in_transaction: bool = False
                             ) -> subprocess.Popen:
    """Another process holding the writer queue and, ``in_transaction``, SQLite's write lock."""
    script = ("import fcntl, os, sqlite3, sys, time\n"
              "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
              "fcntl.flock(fd, fcntl.LOCK_EX)\n"
              "if sys.argv[4] == '1':\n"
              "    sqlite3.connect(sys.argv[3], isolation_level=None).execute('BEGIN IMMEDIATE')\n"
              "open(sys.argv[2], 'w').close()\n"
              "time.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", script, str(_writer_file(db)), str(ready),
                               str(db), "1" if in_transaction else "0"])
    wait_until(ready.exists, what="the other process to hold the lock")
    return holder


def test_a_writer_gives_up_after_the_timeout_with_database_is_locked(sqlite_path, tmp_path,
                                                                     monkeypatch):
    from django.db import OperationalError

    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "timeout", 0.3)
    # Inside a write transaction: a holder of the queue alone is passed (test_frozen_writer).
    holder = _hold_in_another_process(sqlite_path, tmp_path / "holding", in_transaction=True)
    waiters = _waiter_threads()
    try:
        for begin in (transaction.atomic, connection.write_transaction, transaction.atomic):
            with pytest.raises(OperationalError, match="database is locked"), begin():
                _add_worker("never")
        assert not Worker.objects.exists()
        assert _waiter_threads() <= waiters + 1  # one waiter thread, not one per wait
    finally:
        holder.kill()
        holder.wait(10)
    with transaction.atomic():  # free again: the same connection writes
        _add_worker("later")
    assert list(Worker.objects.values_list("owner", flat=True)) == ["later"]


def test_the_event_and_step_run_indexes_the_unique_constraints_cover_are_gone(sqlite_path):
    with connection.cursor() as cursor:
        indexes = {name: sql for name, sql in cursor.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' "
            "AND tbl_name IN ('runtime_event', 'runtime_step')")}
        triggers = {name for (name,) in cursor.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    assert not [n for n in indexes if n.endswith(("_run_id_d25e86d3", "_run_id_7d62677f"))]
    assert sum(1 for n in indexes if n.startswith("sqlite_autoindex_")) == 2  # the uniques
    assert {"runtime_event_no_update", "runtime_event_no_delete"} <= triggers


# -- the database's files: private whatever the umask, never on a network file system --------


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def open_sqlite(django_db_blocker):
    """Opens a database file of the test's choosing with the project's backend and settings;
    closes what it opened."""
    from runtime.benchkit.db import sqlite_config

    opened: list[DatabaseWrapper] = []

    def open_(path: Path, **options: object) -> DatabaseWrapper:
        config = sqlite_config(path)
        config["OPTIONS"].update(options)
        settings_dict = ConnectionHandler().configure_settings({"default": config})["default"]
        wrapper = DatabaseWrapper(settings_dict, alias=f"files-{len(opened)}")
        opened.append(wrapper)
        wrapper.ensure_connection()
        return wrapper

    with django_db_blocker.unblock():
        try:
            yield open_
        finally:
            for wrapper in opened:
                wrapper.close()


def test_a_fresh_database_and_its_wal_shm_and_lock_are_0600_in_a_0700_directory(
        tmp_path, open_sqlite):
    db = tmp_path / "var" / "sub" / "runtime.sqlite3"
    old = os.umask(0o022)  # a typical umask: SQLite alone would make 0644 files
    try:
        wrapper = open_sqlite(db)
        with wrapper.write_transaction(), wrapper.cursor() as cursor:
            cursor.execute("CREATE TABLE t (x)")
            cursor.execute("INSERT INTO t VALUES (1)")
        companions = [Path(f"{db}{suffix}") for suffix in ("-wal", "-shm", ".writer")]
        assert all(p.exists() for p in companions)
        assert {str(p): _mode(p) for p in [db, *companions]} == {
            str(p): 0o600 for p in [db, *companions]}
        assert _mode(tmp_path / "var") == _mode(tmp_path / "var" / "sub") == 0o700
    finally:
        os.umask(old)


def test_an_existing_database_keeps_its_mode(tmp_path, open_sqlite):
    db = tmp_path / "runtime.sqlite3"
    sqlite3.connect(db).close()
    os.chmod(db, 0o644)
    open_sqlite(db).close()
    assert _mode(db) == 0o644  # the operator's file: runtime.W001 reports it, we do not chmod


@pytest.fixture
def fake_mounts(tmp_path, monkeypatch):
    """``mount(fstype)``: a directory under tmp_path that the backend now believes is a mount
    of that type (the mount table it reads is a fake mountinfo)."""
    info = tmp_path / "mountinfo"
    info.write_text("27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n")
    monkeypatch.setattr(files, "MOUNTINFO", str(info))

    def mount(fstype: str) -> Path:
        point = tmp_path / fstype.replace(".", "-")
        point.mkdir()
        with info.open("a") as fh:
            fh.write(f"40 27 0:40 / {point} rw,relatime - {fstype} server:/export rw\n")
        return point

    return mount


@pytest.mark.parametrize("fstype", ["nfs", "nfs4", "cifs", "smb3", "fuse.sshfs"])
def test_a_database_on_a_network_file_system_is_refused_naming_path_and_type(
        fake_mounts, open_sqlite, fstype):
    db = fake_mounts(fstype) / "runtime.sqlite3"
    with pytest.raises(files.NetworkFilesystemError) as refused:
        open_sqlite(db)
    assert str(refused.value).startswith(
        f"refusing to open the SQLite database {db}: it is on a network file system "
        f"({fstype}: server:/export on {db.parent})")
    assert not db.exists()  # nothing created there


@pytest.mark.parametrize("fstype", ["ext4", "xfs", "tmpfs", "overlay", "fuse.fuse-overlayfs"])
def test_a_database_on_a_local_file_system_opens(fake_mounts, open_sqlite, fstype):
    db = fake_mounts(fstype) / "runtime.sqlite3"
    wrapper = open_sqlite(db)
    with wrapper.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
    assert _mode(db) == 0o600


def test_with_the_writer_queue_off_the_files_are_private_and_no_lock_is_taken(
        tmp_path, open_sqlite, fake_mounts):
    db = tmp_path / "runtime.sqlite3"
    wrapper = open_sqlite(db, writer_queue=False)
    with wrapper.write_transaction(), wrapper.cursor() as cursor:
        cursor.execute("CREATE TABLE t (x)")
    assert not Path(f"{db}.writer").exists()
    assert _mode(db) == _mode(Path(f"{db}-wal")) == 0o600
    with pytest.raises(files.NetworkFilesystemError):  # refused all the same
        open_sqlite(fake_mounts("nfs") / "runtime.sqlite3", writer_queue=False)
