"""``manage.py auditrole ROLE [--apply]``: the grants for an application role on PostgreSQL
that cannot drop the audit log's triggers, and a check of that role."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

from runtime.storage.postgres.auditrole import role_grants, role_problems


class Command(BaseCommand):
    help = ("Print (or with --apply, run, as the tables' owner) the grants that let ROLE run the "
            "application without being able to alter the audit log, then check ROLE: no "
            "superuser, owns no table, no CREATE, no UPDATE/DELETE/TRUNCATE on the audit "
            "tables. Re-run --apply after migrations that add tables. PostgreSQL only.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("role")
        parser.add_argument("--apply", action="store_true",
                            help="run the statements on this database (connect as its owner)")

    def handle(self, *args: Any, role: str, apply: bool = False, **options: Any) -> None:
        if connection.vendor != "postgresql":
            raise CommandError("database roles are a PostgreSQL matter; on SQLite protect the "
                               "file (0600, one service account) and take checkpoints")
        try:
            statements = role_grants(role)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if not apply:
            for sql in statements:
                self.stdout.write(sql + ";")
            return
        problems = role_problems(role)
        if problems and "does not exist" in problems[0]:
            raise CommandError(problems[0])
        with transaction.atomic(), connection.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
        problems = role_problems(role)
        if problems:
            raise CommandError("grants applied, but:\n" + "\n".join(problems))
        self.stdout.write(f"ok: {role} can read and write the runtime's rows and cannot alter "
                          "the audit log")
