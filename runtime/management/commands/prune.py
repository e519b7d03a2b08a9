"""``manage.py prune``: archive finished runs and remove them, remove old notifications, and
reclaim the SQLite file's free pages (docs/operations/retention.md)."""

from __future__ import annotations

import getpass
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from runtime import crashpoints
from runtime.clock import SYSTEM_CLOCK
from runtime.errors import CheckpointRefused, PruneRefused
from runtime.retention.dates import parse_before
from runtime.retention.outbox import notifications_prune, notifications_retention_cutoff
from runtime.retention.prune import DEFAULT_BATCH, MAX_BATCH, runs_prune
from runtime.retention.space import sqlite_reclaim


class Command(BaseCommand):
    help = ("Archive every run finished before DATE (succeeded, failed or cancelled) to DIR "
            "and remove it from the database, in batches, while workers keep running: a signed "
            "audit checkpoint first (RUNTIME_AUDIT_KEY; --no-checkpoint to go without), then per "
            "batch an archive file (0600, synced) and one transaction that records the pruning "
            "and deletes the runs. `verifyaudit --archive DIR` proves the archived runs. Also "
            "removes delivered notifications (--notifications-before, or "
            "RUNTIME_RETAIN_NOTIFICATIONS_DAYS) and reclaims SQLite's free pages (--vacuum). "
            "Dates: 2026-01-31, an ISO time, or 90d.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--finished-before", metavar="DATE",
                            help="archive and remove runs finished before this")
        parser.add_argument("--archive", metavar="DIR",
                            help="where the archive files go (created 0700)")
        parser.add_argument("--notifications-before", metavar="DATE",
                            help="remove notifications delivered or given up, created before "
                                 "this (default: RUNTIME_RETAIN_NOTIFICATIONS_DAYS ago, if set)")
        parser.add_argument("--batch", type=int, default=DEFAULT_BATCH,
                            help=f"runs per archive file and transaction (1 to {MAX_BATCH}; "
                                 f"default {DEFAULT_BATCH})")
        parser.add_argument("--no-checkpoint", action="store_true",
                            help="prune without a signed checkpoint first (the archive is then "
                                 "proved only against the database's own record)")
        parser.add_argument("--vacuum", action="store_true",
                            help="SQLite: give the free pages back to the file system (the "
                                 "first time a full VACUUM that holds the write lock)")
        parser.add_argument("--by", default="", help="who prunes (default: this OS user)")

    def handle(self, *args: Any, **opts: Any) -> None:
        now = SYSTEM_CLOCK.now()
        finished, archive = opts["finished_before"], opts["archive"]
        if (finished is None) != (archive is None):
            raise CommandError("--finished-before and --archive go together: runs are removed "
                               "only once archived")
        try:
            runs_before = parse_before(finished, now) if finished is not None else None
            notes_before = (parse_before(opts["notifications_before"], now)
                            if opts["notifications_before"] is not None
                            else notifications_retention_cutoff(now))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        for name, at in (("--finished-before", runs_before),
                         ("--notifications-before", notes_before)):
            if at is not None and at > now:
                raise CommandError(f"{name} {at.isoformat()} is in the future")
        if not 1 <= opts["batch"] <= MAX_BATCH:
            raise CommandError(f"--batch must be 1 to {MAX_BATCH}, not {opts['batch']}")
        if opts["vacuum"] and connection.vendor != "sqlite":
            raise CommandError("--vacuum is for SQLite; on PostgreSQL autovacuum reuses the "
                               "space, and VACUUM FULL or pg_repack return it to the OS "
                               "(docs/operations/retention.md)")
        if runs_before is None and notes_before is None and not opts["vacuum"]:
            raise CommandError("nothing to prune: give --finished-before DATE --archive DIR, "
                               "--notifications-before DATE (or set "
                               "RUNTIME_RETAIN_NOTIFICATIONS_DAYS), or --vacuum")
        crashpoints.arm_from_env()  # the crash test kit arms this process through its env
        by = opts["by"] or getpass.getuser()
        try:
            if runs_before is not None:
                self._runs(runs_before, archive, by, now, opts)
            if notes_before is not None:
                notes, attempts = notifications_prune(before=notes_before, now=now)
                self.stdout.write(f"notifications: {notes} removed (created before "
                                  f"{notes_before.isoformat()}), with {attempts} attempts")
        except (PruneRefused, CheckpointRefused) as exc:
            raise CommandError(str(exc)) from None
        if opts["vacuum"]:
            done = sqlite_reclaim()
            tail = "" if done.checkpointed else " (a reader held the WAL: it shrinks later)"
            self.stdout.write(f"reclaimed ({done.mode}): {done.before:,} bytes before, "
                              f"{done.after:,} after{tail}")

    def _runs(self, before: datetime, archive: str, by: str, now: datetime,
              opts: dict[str, Any]) -> None:
        def report(line: str) -> None:
            if opts["verbosity"] > 1:
                self.stdout.write(line)

        done = runs_prune(finished_before=before, directory=archive, by=by, now=now,
                          batch=opts["batch"], checkpoint=not opts["no_checkpoint"],
                          report=report)
        if done.broken:
            self.stderr.write(f"{len(done.broken)} run(s) left in place because they do not "
                              f"verify (run verifyaudit): {done.broken[:20]}")
        kept = (f"; {done.notifying} finished run(s) kept until their notifications are "
                "delivered" if done.notifying else "")
        made = (f"checkpoint #{done.checkpoint}, " if done.checkpoint is not None
                else "no checkpoint, ")
        span = (f"prunings #{done.prunings[0]}..#{done.prunings[-1]}" if done.prunings
                else "no pruning")
        self.stdout.write(f"runs: {done.runs} archived to {archive} and removed ({done.events} "
                          f"events; {made}{span}){kept}")
