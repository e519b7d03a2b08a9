"""``manage.py backup`` and ``manage.py restore``: the procedures, each one call.

A backup first records its moment in the database (a ``Backup`` row, committed before the
copy's snapshot, so the copy holds it), then a signed audit checkpoint when a key is set (the
copy holds that checkpoint's row too), then the copy. A restore refuses while a worker is live,
writes the backup over the database, migrates it (a backup may predate an upgrade) and fences
it (``runtime.backups.fence``): all in one command.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from django.core.management import call_command
from django.db import DatabaseError

from runtime.audit.checkpoint import audit_key, checkpoint_take, checkpoint_write
from runtime.backups.behind import SUFFIX, checkpoint_dir, newest_checkpoint_time
from runtime.backups.copy import copy_in, copy_out, sqlite_file, vendor
from runtime.backups.fence import restore_fence
from runtime.backups.pending import restore_pending_clear, restore_pending_set
from runtime.canonical import iso_time
from runtime.errors import AuditKeyError, RestoreRefused, one_line
from runtime.models import Backup, Restoration
from runtime.selectors.workers import live_workers

LIVE_FILES = ("", "-wal", "-shm", "-journal", ".writer", ".restoring")


@dataclass(frozen=True)
class BackupTaken:
    path: Path
    taken_at: datetime
    checkpoint: Path | None  # the signed checkpoint written beside it, when a key is set


def backup_take(path: str | Path, *, by: str, now: datetime) -> BackupTaken:
    """Copy the live database to ``path`` (0600, whole or absent) while workers run."""
    path = Path(path)
    if path.exists() and path.is_dir():
        raise RestoreRefused(str(path), "is a directory; give the backup file's path")
    if not path.parent.is_dir():
        raise RestoreRefused(str(path), "its directory does not exist")
    if vendor() == "sqlite":
        live = Path(sqlite_file("default")).resolve()
        if path.resolve() in {Path(f"{live}{tail}") for tail in LIVE_FILES}:
            raise RestoreRefused(str(path), "is the live database or one of its files; write "
                                 "the backup somewhere else (ideally another disk)")
    Backup.objects.create(taken_at=now, by=by, engine=vendor(), path=str(path)[:1000])
    checkpoint = None
    try:
        audit_key()
    except AuditKeyError:
        pass  # no key, no checkpoint: the backup is still whole
    else:
        doc = checkpoint_take(by=by, now=now)
        checkpoint = path.with_name(path.name + SUFFIX)
        checkpoint_write(doc, checkpoint)
        directory = checkpoint_dir()
        if directory is not None:  # the newest checkpoint the world knows, off this machine
            checkpoint_write(doc, directory / f"{iso_time(now).replace(':', '')}{SUFFIX}")
    copy_out(path)
    return BackupTaken(path, now, checkpoint)


def backup_restore(path: str | Path, *, by: str, now: datetime,
                   taken_at: datetime | None = None) -> Restoration:
    """Write the backup at ``path`` over the database, migrate it and fence it. The database
    is marked as being restored first (``runtime.backups.pending``): if anything stops the
    restore after the copy, workers refuse to start until ``restore --acknowledge``."""
    path = Path(path)
    if not path.is_file():
        raise RestoreRefused(str(path), "no such backup file")
    checkpoint_at = newest_checkpoint_time()  # everything that can be asked, before any change
    refuse_while_workers_live(now)
    restore_pending_set()
    try:
        copy_in(path)  # one transaction: refused or failed, the database is as it was
    except BaseException:
        restore_pending_clear()
        raise
    try:
        call_command("migrate", verbosity=0, interactive=False)
        done = restore_fence(by=by, now=now, taken_at=taken_at, checkpoint_at=checkpoint_at)
    except Exception as exc:
        raise RestoreRefused(str(path), f"the backup was written over the database but not "
                             f"fenced ({one_line(exc)}); workers refuse to start until "
                             "`manage.py restore --acknowledge` fences it") from exc
    restore_pending_clear()
    return done


def backup_acknowledge(*, by: str, now: datetime,
                       taken_at: datetime | None = None) -> Restoration:
    """Fence a database someone restored by other means (a file copied back, a dump loaded),
    or one whose restore stopped before its fence."""
    checkpoint_at = newest_checkpoint_time()
    refuse_while_workers_live(now)
    done = restore_fence(by=by, now=now, taken_at=taken_at, checkpoint_at=checkpoint_at)
    restore_pending_clear()
    return done


def refuse_while_workers_live(now: datetime) -> None:
    """A worker must not run on the data being replaced or fenced."""
    try:
        live = live_workers(now)
    except DatabaseError:  # no runtime tables yet (a new machine): nobody is registered
        return
    if live:
        raise RestoreRefused("", f"{len(live)} worker(s) are live ({', '.join(live[:3])}"
                             f"{', ...' if len(live) > 3 else ''}): stop every worker first")
