"""A restore under way, marked outside the data it replaces: workers refuse to start until the
fence clears it, so a restore that stopped between writing the backup and fencing it (a failed
migration, Ctrl-C, a power cut) cannot let a worker loose on unfenced runs.

SQLite: a file beside the database (``<database>.restoring``, 0600). PostgreSQL: a setting of
the database itself (``ALTER DATABASE ... SET runtime.restore_pending``), which no dump
carries and every new connection reads.
"""

from __future__ import annotations

from pathlib import Path

from django.db import connections

from runtime.backups.copy import sqlite_file, vendor
from runtime.host.files import private_file

SETTING = "runtime.restore_pending"


def _marker(using: str) -> Path:
    return Path(sqlite_file(using) + ".restoring")


def _alter(using: str, clause: str) -> None:
    db = connections[using]
    name = db.ops.quote_name(str(db.settings_dict["NAME"]))
    with db.cursor() as cursor:
        cursor.execute(f"ALTER DATABASE {name} {clause}")


def restore_pending_set(using: str = "default") -> None:
    """Mark the database as being restored (before anything of it is replaced)."""
    if vendor(using) == "sqlite":
        private_file(_marker(using))
    else:
        _alter(using, f"SET {SETTING} = 'on'")


def restore_pending_clear(using: str = "default") -> None:
    """The database is fenced: workers may start."""
    if vendor(using) == "sqlite":
        _marker(using).unlink(missing_ok=True)
    else:
        _alter(using, f"RESET {SETTING}")
        connections[using].close()  # a new connection reads the database's settings again


def restore_pending(using: str = "default") -> bool:
    """Whether a restore of this database has not been fenced yet."""
    if vendor(using) == "sqlite":
        return _marker(using).exists()
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT current_setting(%s, true)", [SETTING])
        (value,) = cursor.fetchone()
    return value == "on"
