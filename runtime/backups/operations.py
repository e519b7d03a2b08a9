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
from runtime.backups.copy import copy_in, copy_out, vendor
from runtime.backups.fence import restore_fence
from runtime.canonical import iso_time
from runtime.errors import AuditKeyError, RestoreRefused
from runtime.models import Backup, Restoration
from runtime.selectors.workers import live_workers


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
    """Write the backup at ``path`` over the database, migrate it and fence it."""
    path = Path(path)
    if not path.is_file():
        raise RestoreRefused(str(path), "no such backup file")
    refuse_while_workers_live(now)
    copy_in(path)
    call_command("migrate", verbosity=0, interactive=False)
    return restore_fence(by=by, now=now, taken_at=taken_at,
                         checkpoint_at=newest_checkpoint_time())


def backup_acknowledge(*, by: str, now: datetime,
                       taken_at: datetime | None = None) -> Restoration:
    """Fence a database someone restored by other means (a file copied back, a dump loaded)."""
    refuse_while_workers_live(now)
    return restore_fence(by=by, now=now, taken_at=taken_at,
                         checkpoint_at=newest_checkpoint_time())


def refuse_while_workers_live(now: datetime) -> None:
    """A worker must not run on the data being replaced or fenced."""
    try:
        live = live_workers(now)
    except DatabaseError:  # no runtime tables yet (a new machine): nobody is registered
        return
    if live:
        raise RestoreRefused("", f"{len(live)} worker(s) are live ({', '.join(live[:3])}"
                             f"{', ...' if len(live) > 3 else ''}): stop every worker first")
