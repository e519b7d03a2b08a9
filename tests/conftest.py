"""Test fixtures: every runtime test gets its own migrated SQLite file (WAL needs a file, and
threads need real commits), copied from one template migrated once per session."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections


def _point_default_at(path: Path | str) -> None:
    connections.close_all()
    settings.DATABASES["default"]["NAME"] = str(path)


@pytest.fixture(scope="session")
def _db_template(tmp_path_factory: pytest.TempPathFactory, django_db_blocker) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.sqlite3"
    original = settings.DATABASES["default"]["NAME"]
    with django_db_blocker.unblock():
        _point_default_at(path)
        call_command("migrate", verbosity=0, interactive=False)
        connections.close_all()
    settings.DATABASES["default"]["NAME"] = original
    return path


@pytest.fixture
def rdb(_db_template: Path, tmp_path: Path, django_db_blocker) -> Iterator[Path]:
    """A fresh migrated database file for this test; real commits, any thread may use it."""
    path = tmp_path / "runtime.sqlite3"
    shutil.copyfile(_db_template, path)
    original = settings.DATABASES["default"]["NAME"]
    with django_db_blocker.unblock():
        _point_default_at(path)
        try:
            yield path
        finally:
            connections.close_all()
            settings.DATABASES["default"]["NAME"] = original


@pytest.fixture
def crash() -> Iterator:
    """Arm in-process crash points: ``crash(CrashPoint.X, step_index=2)``; disarmed after."""
    from runtime import crashpoints

    def arm(point, step_index: int | None = None, occurrence: int = 1) -> None:
        crashpoints.arm([crashpoints.Arm(point, step_index, occurrence)])

    yield arm
    crashpoints.disarm()


@pytest.fixture
def clock():
    """A clock that moves only when the test says so."""
    from runtime.clock import ManualClock

    return ManualClock()


@pytest.fixture
def spawn(rdb: Path, tmp_path: Path) -> Iterator:
    """Start real worker processes on this test's database; each is ended by its pid after."""
    from tests.procs import WorkerProcess

    started: list[WorkerProcess] = []

    def start(*args: str, **kw) -> WorkerProcess:
        proc = WorkerProcess(rdb, tmp_path, *args, **kw)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
