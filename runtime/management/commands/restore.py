"""``manage.py restore PATH``: put a backup back so that no side effect runs again unasked."""

from __future__ import annotations

import getpass
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runtime.backups.operations import backup_acknowledge, backup_restore
from runtime.clock import SYSTEM_CLOCK
from runtime.errors import RestoreRefused
from runtime.retention.dates import parse_before


def _moment(text: str, now: datetime) -> datetime:
    try:
        at = parse_before(text, now)
    except ValueError as exc:
        raise CommandError(f"--taken-at: {exc}") from None
    if at > now:
        raise CommandError(f"--taken-at {text!r} is in the future: give the backup's moment")
    return at


class Command(BaseCommand):
    help = ("Restore the database from a backup written by `manage.py backup`, with every "
            "worker stopped, then fence it: each run that was not finished at the backup's "
            "moment waits for a person before each of its side effects (a 'restored' "
            "approval). With --acknowledge and no PATH, fence a database that was restored by "
            "other means.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("path", nargs="?", help="the backup file")
        parser.add_argument("--acknowledge", action="store_true",
                            help="the database was already restored: only fence it")
        parser.add_argument("--taken-at", metavar="TIME",
                            help="the backup's moment, when the database records none (ISO "
                                 "8601; UTC when no zone is given)")
        parser.add_argument("--by", default="", help="who restores (default: this OS user)")

    def handle(self, *args: Any, path: str | None = None, acknowledge: bool = False,
               taken_at: str | None = None, by: str = "", **options: Any) -> None:
        if bool(path) == acknowledge:
            raise CommandError("give the backup file, or --acknowledge (and no file) for a "
                               "database already restored by other means")
        who, now = by or getpass.getuser(), SYSTEM_CLOCK.now()
        moment = _moment(taken_at, now) if taken_at else None
        try:
            if path:
                done = backup_restore(path, by=who, now=now, taken_at=moment)
            else:
                done = backup_acknowledge(by=who, now=now, taken_at=moment)
        except (RestoreRefused, OSError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"restored from the backup of {done.backup_taken_at:%Y-%m-%d %H:%M:%S} UTC: "
            f"{done.runs_held} unfinished run(s) held; each of their side effects now waits "
            "for a person in the console. Start the workers.")
