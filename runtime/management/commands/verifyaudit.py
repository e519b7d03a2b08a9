"""``manage.py verifyaudit [--run ID]``: check every run's audit hash chain."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runtime.audit import verify
from runtime.models import Run


class Command(BaseCommand):
    help = "Verify the audit log's per-run hash chains; exit non-zero on the first broken link."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--run", type=int, help="verify only this run")

    def handle(self, *args: Any, run: int | None = None, **options: Any) -> None:
        if run is not None:
            if not Run.objects.filter(pk=run).exists():
                raise CommandError(f"no run with id {run}")
            runs = Run.objects.filter(pk=run)
        else:
            runs = Run.objects.order_by("pk")
        checked = broken = 0
        for r in runs.iterator(chunk_size=500):
            result = verify(r)
            checked += 1
            if not result.ok:
                broken += 1
                self.stderr.write(str(result))
            elif options["verbosity"] > 1:
                self.stdout.write(str(result))
        if broken:
            raise CommandError(f"{broken} of {checked} runs have a broken audit chain")
        self.stdout.write(f"ok: {checked} runs verified")
