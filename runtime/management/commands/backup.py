"""``manage.py backup PATH``: a consistent online copy of the database, safe to restore."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runtime.backups.operations import backup_take
from runtime.clock import SYSTEM_CLOCK
from runtime.errors import AuditKeyError, CheckpointRefused, RestoreRefused


class Command(BaseCommand):
    help = ("Copy the database to PATH (0600, whole or absent) while workers run: SQLite's "
            "online backup, or pg_dump's custom format on PostgreSQL. The copy records its own "
            "moment; with RUNTIME_AUDIT_KEY set a signed checkpoint is written beside it "
            "(PATH.checkpoint.json) and into RUNTIME_CHECKPOINT_DIR. Restore it with "
            "`manage.py restore PATH`.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("path", help="the backup file to write")
        parser.add_argument("--by", default="", help="who takes it (default: this OS user)")

    def handle(self, *args: Any, path: str, by: str = "", **options: Any) -> None:
        try:
            taken = backup_take(path, by=by or getpass.getuser(), now=SYSTEM_CLOCK.now())
        except (RestoreRefused, AuditKeyError, CheckpointRefused, OSError) as exc:
            raise CommandError(str(exc)) from None
        tail = f"; checkpoint {taken.checkpoint}" if taken.checkpoint else (
            "; no checkpoint (RUNTIME_AUDIT_KEY is not set)")
        self.stdout.write(f"backup of {taken.taken_at:%Y-%m-%d %H:%M:%S} UTC written to "
                          f"{taken.path}{tail}")
