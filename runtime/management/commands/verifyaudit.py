"""``manage.py verifyaudit [--run ID] [--checkpoint FILE]``: check the whole audit record."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runtime.audit.check import audit_check
from runtime.audit.checkpoint import checkpoint_load
from runtime.errors import AuditKeyError, CheckpointRefused
from runtime.models import Run


class Command(BaseCommand):
    help = ("Verify the audit record: the append-only triggers, the global chain of run "
            "creations, every run's hash chain and rows replayed from its events, and (with "
            "--checkpoint) that nothing before a signed checkpoint changed. Exits non-zero on "
            "any problem, each printed on one line.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--run", type=int, help="verify only this run's chain and rows")
        parser.add_argument("--checkpoint", metavar="FILE",
                            help="a file written by `manage.py auditcheckpoint` (needs "
                                 "RUNTIME_AUDIT_KEY, the key it was signed with)")

    def handle(self, *args: Any, run: int | None = None, checkpoint: str | None = None,
               **options: Any) -> None:
        if run is not None and not Run.objects.filter(pk=run).exists():
            raise CommandError(f"no run with id {run}")
        doc = None
        if checkpoint is not None:
            try:
                doc = checkpoint_load(checkpoint)
            except (AuditKeyError, CheckpointRefused) as exc:
                raise CommandError(str(exc)) from None
        verbose = options["verbosity"] > 1
        result = audit_check(run_id=run, checkpoint=doc, report=self.stderr.write,
                             progress=self.stdout.write if verbose else None)
        if result.problems:
            raise CommandError(f"{result.problems} problem(s): {result.broken_runs} of "
                               f"{result.runs} runs broken")
        tail = f"; checkpoint #{result.checkpoint} holds" if result.checkpoint else ""
        self.stdout.write(f"ok: {result.runs} runs verified, triggers in place, global chain "
                          f"of {result.creations} creations intact{tail}")
