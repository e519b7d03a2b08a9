"""Test fixtures: every runtime test gets its own migrated database with real commits (WAL
needs a file, and threads need real commits). On SQLite a file copied from a template migrated
once per session; on PostgreSQL a database created from a template database migrated once per
session. A test runs on both engines when marked ``engines`` (see tests/engines.py): it asks
for ``database``; ``sqlite_path`` stays the SQLite file, for tests about SQLite itself."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import call_command

from runtime.benchkit.db import use_database
from tests.engines import (
    ENGINES,
    EngineDB,
    admin_connection,
    create_database,
    current_config,
    drop_database,
    postgres_config,
    postgres_db,
    sqlite_db,
    unique_name,
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``@pytest.mark.engines`` runs a test once per engine (``engines("sqlite")`` narrows it);
    unmarked tests get SQLite alone."""
    marker = metafunc.definition.get_closest_marker("engines")
    if marker is None or "engine" not in metafunc.fixturenames:
        return
    names = list(marker.args or ENGINES)
    unknown = set(names) - set(ENGINES)
    if unknown:
        raise pytest.UsageError(f"unknown engine(s) {sorted(unknown)}; known: {ENGINES}")
    # `make test-quick` runs the SQLite half alone (RUNTIME_TEST_ENGINES=sqlite), for a
    # contributor without PostgreSQL; `make test` runs every engine, and PostgreSQL's half
    # fails without a server.
    chosen = os.environ.get("RUNTIME_TEST_ENGINES", "").split(",")
    if chosen != [""]:
        names = [n for n in names if n in chosen]
    metafunc.parametrize("engine", names, indirect=True, ids=names)


@pytest.fixture(scope="session")
def _sqlite_settings() -> dict[str, Any]:
    """The project's SQLite settings as the session started, to come back to after each test."""
    return current_config()


@pytest.fixture(scope="session")
def _db_template(_sqlite_settings: dict[str, Any], tmp_path_factory: pytest.TempPathFactory,
                 django_db_blocker) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.sqlite3"
    with django_db_blocker.unblock():
        use_database({**_sqlite_settings, "NAME": str(path)})
        try:
            call_command("migrate", verbosity=0, interactive=False)
        finally:
            use_database(_sqlite_settings)
    return path


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[psycopg.Connection]:
    """The session's connection to the PostgreSQL server, for CREATE and DROP DATABASE."""
    admin = admin_connection()
    try:
        yield admin
    finally:
        admin.close()


@pytest.fixture(scope="session")
def _pg_template(pg_admin: psycopg.Connection, _sqlite_settings: dict[str, Any],
                 django_db_blocker) -> Iterator[str]:
    """A PostgreSQL database migrated once per session, every connection to it closed so
    ``CREATE DATABASE ... TEMPLATE`` can copy it; dropped at the session's end."""
    name = unique_name("tmpl")
    create_database(pg_admin, name)
    try:
        with django_db_blocker.unblock():
            use_database(postgres_config(postgres_db(name).url))
            try:
                call_command("migrate", verbosity=0, interactive=False)
            finally:
                use_database(_sqlite_settings)
        yield name
    finally:
        drop_database(pg_admin, name)


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> str:
    """This test's engine: a parameter where the test is marked ``engines``, else SQLite."""
    return getattr(request, "param", "sqlite")


@pytest.fixture
def database(engine: str, request: pytest.FixtureRequest, tmp_path: Path,
        _sqlite_settings: dict[str, Any], django_db_blocker) -> Iterator[EngineDB]:
    """A fresh migrated database on this test's engine, Django's default connection pointed at
    it; any thread may use it, and subprocesses open it with ``database.url``."""
    if engine == "sqlite":
        path = tmp_path / "runtime.sqlite3"
        shutil.copyfile(request.getfixturevalue("_db_template"), path)
        db, config = sqlite_db(path), {**_sqlite_settings, "NAME": str(path)}
        admin = None
    else:
        template = request.getfixturevalue("_pg_template")
        admin = request.getfixturevalue("pg_admin")
        db = postgres_db(unique_name("test"))
        create_database(admin, db.name, template)
        config = postgres_config(db.url)
    try:
        with django_db_blocker.unblock():
            use_database(config)
            try:
                yield db
            finally:
                use_database(_sqlite_settings)
    finally:
        if admin is not None:
            drop_database(admin, db.name)


@pytest.fixture
def sqlite_path(database: EngineDB) -> Path:
    """This test's SQLite file, for tests about SQLite itself (PRAGMAs, the writer queue, the
    file); a test that runs on every engine asks for ``database`` instead."""
    if database.path is None:
        pytest.fail("this test asks for sqlite_path, a SQLite file, but runs on PostgreSQL: "
                    "ask for database, or mark it engines('sqlite')", pytrace=False)
    return database.path


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
def spawn(database: EngineDB, tmp_path: Path) -> Iterator:
    """Start real worker processes on this test's database (either engine); each is ended by
    its pid after."""
    from tests.procs import SpawnedWorker

    started: list[SpawnedWorker] = []

    def start(*args: str, **kw) -> SpawnedWorker:
        proc = SpawnedWorker(database, tmp_path, *args, **kw)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
