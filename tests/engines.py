"""The databases the runtime's contract tests run on, and the switch between them.

The same code must keep the same promises on SQLite and on PostgreSQL (design §1, §12), so a
contract test opts into both engines with ``@pytest.mark.engines`` (or a module's
``pytestmark``) and asks for ``database``: a fresh migrated database on this test's engine, which
Django's default connection points at for the test. PostgreSQL is mandatory: without a server
the PostgreSQL half of every such test fails, it never skips.

Switching engines means swapping the whole settings dict of the default connection in place
(the connection handler holds that very dict) and dropping the cached connection wrapper, whose
class belongs to the old engine.
"""

from __future__ import annotations

import copy
import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS

ENGINES = ("sqlite", "postgres")
SERVER = os.environ.get("RUNTIME_TEST_POSTGRES", "postgres://root@127.0.0.1:5432/postgres")
START_HINT = ("start it with `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) "
              "main start`, or point RUNTIME_TEST_POSTGRES at another server")

_names = itertools.count(1)


@dataclass(frozen=True)
class EngineDB:
    """One test's database: which engine, the ``DATABASE_URL`` a subprocess needs to open it,
    and (SQLite only) the file."""

    engine: str  # "sqlite" or "postgres": the test id
    vendor: str  # Django's connection.vendor: "sqlite" or "postgresql"
    url: str
    name: str  # the file's path on SQLite, the database's name on PostgreSQL
    path: Path | None = None

    @property
    def is_sqlite(self) -> bool:
        return self.vendor == "sqlite"

    @property
    def is_postgres(self) -> bool:
        return self.vendor == "postgresql"


def sqlite_db(path: Path) -> EngineDB:
    return EngineDB("sqlite", "sqlite", f"sqlite:///{path}", str(path), path)


def postgres_db(name: str) -> EngineDB:
    return EngineDB("postgres", "postgresql", postgres_url(name), name)


def postgres_url(name: str) -> str:
    """The server's URL with ``name`` as the database."""
    return urlsplit(SERVER)._replace(path=f"/{name}").geturl()


def unique_name(kind: str) -> str:
    """A database name no other pytest process uses (the pid) nor any other test here."""
    return f"runtime_{kind}_{os.getpid()}_{next(_names)}"


def admin_connection() -> psycopg.Connection:
    """An autocommit connection to the server's maintenance database; fails (never skips) the
    test when there is no server, because PostgreSQL support is part of the contract."""
    try:
        return psycopg.connect(SERVER, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        error = str(exc)
    pytest.fail(f"PostgreSQL is required for these tests and there is no server at {SERVER}: "
                f"{error}\n{START_HINT}", pytrace=False)


def create_database(admin: psycopg.Connection, name: str, template: str | None = None) -> None:
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))


def drop_database(admin: psycopg.Connection, name: str) -> None:
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def postgres_config(url: str) -> dict[str, Any]:
    """The settings a process started with ``DATABASE_URL=url`` would have: the project's own
    reading of the variable, so in-process tests and subprocesses open the database alike."""
    from console import settings as project

    saved = os.environ.get("DATABASE_URL")
    os.environ["DATABASE_URL"] = url
    try:
        return project._database()
    finally:
        if saved is None:
            del os.environ["DATABASE_URL"]
        else:
            os.environ["DATABASE_URL"] = saved


def current_config() -> dict[str, Any]:
    """A copy of the default connection's settings, to restore later."""
    return copy.deepcopy(settings.DATABASES[DEFAULT_DB_ALIAS])
