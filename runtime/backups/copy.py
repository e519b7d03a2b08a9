"""Consistent online copies of the database, and writing one back, on each engine.

SQLite: SQLite's online backup API copies the database from one read transaction (a consistent
snapshot while workers write) into a private temporary file that is synced and renamed into
place, so a backup is whole or absent. Restoring goes the other way through the same API, as
one write transaction on the live database: a console still connected sees the old data or the
new, never a mixture, and the write-ahead log stays consistent (no file is swapped under it).

PostgreSQL: ``pg_dump --format=custom`` (a consistent snapshot of its own) to a temporary file,
renamed into place; restoring is ``pg_restore --clean --if-exists --single-transaction``, so a
failed restore leaves the database as it was.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

from django.db import connections

from runtime.errors import RestoreRefused
from runtime.host.files import database_path, open_private, publish, temporary_beside

PG_TIMEOUT = 6 * 3600  # seconds: a dump or restore that takes longer is stuck


def vendor(using: str = "default") -> str:
    return str(connections[using].vendor)


def copy_out(path: Path, using: str = "default") -> None:
    """Write a consistent copy of the live database to ``path`` (0600, whole or absent)."""
    temporary = temporary_beside(path)
    os.close(open_private(temporary, os.O_WRONLY | os.O_TRUNC))
    try:
        if vendor(using) == "sqlite":
            source = sqlite3.connect(sqlite_file(using), timeout=60)
            target = sqlite3.connect(temporary)
            try:
                source.backup(target)  # every page in one step: one read snapshot
                # A file on its own: no -wal or -shm beside it when it is read or restored.
                target.execute("PRAGMA journal_mode = DELETE")
            finally:
                target.close()
                source.close()
        else:
            _pg_tool(["pg_dump", "--format=custom", "--file", str(temporary)], using)
        publish(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def copy_in(path: Path, using: str = "default") -> None:
    """Replace the live database's content with the backup at ``path`` (one transaction)."""
    if vendor(using) == "sqlite":
        check_sqlite_backup(path)
        connections[using].close()
        source = sqlite3.connect(path, timeout=60)
        target = sqlite3.connect(sqlite_file(using), timeout=60)
        try:
            source.backup(target)
        finally:
            target.close()
            source.close()
    else:
        check_pg_backup(path)
        try:
            _pg_tool(["pg_restore", "--clean", "--if-exists", "--single-transaction",
                      "--exit-on-error", str(path)], using)
        except RestoreRefused as exc:
            raise RestoreRefused(str(path), f"{exc.reason}. Nothing was changed (one "
                                 "transaction). A backup older than this database's schema "
                                 "cannot be written over it: restore it into a new, empty "
                                 "database instead (DATABASE_URL naming it)") from None
        finally:
            connections[using].close()


def check_sqlite_backup(path: Path) -> None:
    """Refuse a file that is not a whole SQLite backup of this runtime."""
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=60)
        try:
            verdict = db.execute("PRAGMA quick_check").fetchone()
            tables = {r[0] for r in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise RestoreRefused(str(path), f"not a SQLite database ({exc})") from None
    if not verdict or verdict[0] != "ok":
        raise RestoreRefused(str(path), f"the copy is damaged: {verdict[0] if verdict else '?'}")
    if not {"runtime_run", "runtime_event"} <= tables:
        raise RestoreRefused(str(path), "not a backup of this runtime's database")


def check_pg_backup(path: Path) -> None:
    """Refuse a file that is not a custom-format dump holding this runtime's tables."""
    try:
        done = subprocess.run(["pg_restore", "--list", str(path)], capture_output=True,
                              text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RestoreRefused(str(path), f"pg_restore could not run: {exc}") from None
    if done.returncode != 0:
        raise RestoreRefused(str(path), "not a pg_dump backup in the custom format")
    listed = done.stdout
    if " TABLE public runtime_run " not in listed or " TABLE public runtime_event " not in listed:
        raise RestoreRefused(str(path), "not a backup of this runtime's database")


def sqlite_file(using: str) -> str:
    found = database_path(connections[using].settings_dict["NAME"])
    if found is None:
        raise RestoreRefused("", "an in-memory database has nothing to back up or restore")
    return str(found)


# libpq's connection keywords a DATABASES entry's OPTIONS may carry (TLS, timeouts, server
# options, keepalives): passed on, so the tools connect as the runtime does (``sslmode`` and
# all). Secrets go in the environment, never on the command line where ``ps`` shows them.
LIBPQ_KEYWORDS = frozenset({
    "application_name", "channel_binding", "client_encoding", "connect_timeout",
    "gssencmode", "hostaddr", "keepalives", "keepalives_count", "keepalives_idle",
    "keepalives_interval", "krbsrvname", "load_balance_hosts", "options", "passfile",
    "require_auth", "requirepeer", "service", "ssl_max_protocol_version",
    "ssl_min_protocol_version", "sslcert", "sslcertmode", "sslcompression", "sslcrl",
    "sslcrldir", "sslkey", "sslmode", "sslnegotiation", "sslrootcert", "sslsni",
    "target_session_attrs", "tcp_user_timeout"})


def _quoted(value: Any) -> str:
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def pg_conninfo(settings: dict[str, Any]) -> str:
    """A libpq connection string for ``settings`` (a DATABASES entry), without its password."""
    parts = {"dbname": settings["NAME"], "host": settings.get("HOST"),
             "port": settings.get("PORT"), "user": settings.get("USER")}
    for key, value in (settings.get("OPTIONS") or {}).items():
        if key in LIBPQ_KEYWORDS:
            parts[key] = value
    return " ".join(f"{k}={_quoted(v)}" for k, v in parts.items() if v not in (None, ""))


def _pg_tool(argv: list[str], using: str) -> None:
    """Run a PostgreSQL client tool against ``using``'s database, connected as the runtime is
    (its settings as a connection string; the password in libpq's environment)."""
    settings: dict[str, Any] = connections[using].settings_dict
    env = dict(os.environ)
    if settings.get("PASSWORD"):
        env["PGPASSWORD"] = str(settings["PASSWORD"])
    argv = [*argv[:1], f"--dbname={pg_conninfo(settings)}", *argv[1:]]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=PG_TIMEOUT,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RestoreRefused("", f"{argv[0]} could not run: {exc}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RestoreRefused("", f"{argv[0]} failed ({done.returncode}): {' / '.join(tail)}")
