"""``manage.py verifyaudit [--run ID] [--checkpoint FILE] [--archive DIR]``: check the whole
audit record, and the runs archived by ``manage.py prune``."""

from __future__ import annotations

from itertools import chain
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runtime.audit.check import audit_check
from runtime.audit.checkpoint import checkpoint_load
from runtime.audit.export import exports_problems
from runtime.errors import AuditKeyError, CheckpointRefused
from runtime.models import PrunedRun, Run
from runtime.retention.record import prunings_problems
from runtime.retention.verify import archives_verify


class Command(BaseCommand):
    help = ("Verify the audit record: the append-only triggers, the global chain of run "
            "creations, every run's hash chain and rows replayed from its events, the records "
            "of prunings and exports, (with --checkpoint) that nothing before a signed "
            "checkpoint changed, and (with --archive) the runs `manage.py prune` archived "
            "there. Exits non-zero on any problem, each printed on one line.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--run", type=int, help="verify only this run's chain and rows")
        parser.add_argument("--checkpoint", metavar="FILE",
                            help="a file written by `manage.py auditcheckpoint` (needs "
                                 "RUNTIME_AUDIT_KEY, the key it was signed with)")
        parser.add_argument("--archive", metavar="DIR", action="append", default=[],
                            help="a directory `manage.py prune --archive` wrote: verify every "
                                 "pruning's file and runs there (repeat for several; needs "
                                 "RUNTIME_AUDIT_KEY when the prunes took checkpoints)")

    def handle(self, *args: Any, run: int | None = None, checkpoint: str | None = None,
               archive: list[str], **options: Any) -> None:
        if run is not None and not Run.objects.filter(pk=run).exists():
            pruned = PrunedRun.objects.filter(run_id=run).values_list(
                "pruning_seq", flat=True).first()
            if pruned is not None:
                raise CommandError(f"run {run} was archived and removed by pruning #{pruned}: "
                                   "verify it with --archive DIR")
            raise CommandError(f"no run with id {run}")
        for directory in archive:
            if not Path(directory).is_dir():
                raise CommandError(f"--archive {directory}: not a directory")
        doc = None
        if checkpoint is not None:
            try:
                doc = checkpoint_load(checkpoint)
            except (AuditKeyError, CheckpointRefused) as exc:
                raise CommandError(str(exc)) from None
        verbose = options["verbosity"] > 1
        result = audit_check(run_id=run, checkpoint=doc, report=self.stderr.write,
                             progress=self.stdout.write if verbose else None)
        problems = result.problems
        for line in chain(prunings_problems(), exports_problems()):
            problems += 1
            self.stderr.write(line)
        tail = f"; checkpoint #{result.checkpoint} holds" if result.checkpoint else ""
        if archive:
            try:
                found = archives_verify([Path(d) for d in archive], report=self.stderr.write)
            except AuditKeyError as exc:
                raise CommandError(f"{exc} (the prunes' archives are proved against the signed "
                                   "checkpoints they took)") from None
            problems += found.problems
            for path in found.unrecorded:
                self.stdout.write(f"note: {path} is on no pruning's record: left by a prune "
                                  "interrupted before its batch committed (its runs are still "
                                  "in the database; the next prune writes it again)")
            tail += (f"; {found.prunings} prunings' archives verified ({found.runs} archived "
                     "runs)")
        if problems:
            raise CommandError(f"{problems} problem(s): {result.broken_runs} of "
                               f"{result.runs} runs broken")
        self.stdout.write(f"ok: {result.runs} runs verified, triggers in place, global chain "
                          f"of {result.creations} creations intact{tail}")
