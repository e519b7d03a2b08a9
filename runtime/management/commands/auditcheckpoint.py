"""``manage.py auditcheckpoint [--out FILE]``: write a signed checkpoint of every chain head."""

from __future__ import annotations

import getpass
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runtime.audit.checkpoint import checkpoint_take, checkpoint_write
from runtime.clock import SYSTEM_CLOCK
from runtime.errors import AuditKeyError, CheckpointRefused


class Command(BaseCommand):
    help = ("Record every audit chain's head, signed with RUNTIME_AUDIT_KEY, to FILE (0600) or "
            "to stdout; copy it off this machine. `verifyaudit --checkpoint FILE` later proves "
            "nothing recorded before it changed. Run `verifyaudit` first: a checkpoint vouches "
            "for what the log says when it is taken.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--out", metavar="FILE", help="write here instead of stdout")
        parser.add_argument("--by", default="", help="who takes it (default: this OS user)")

    def handle(self, *args: Any, out: str | None = None, by: str = "", **options: Any) -> None:
        try:
            doc = checkpoint_take(by=by or getpass.getuser(), now=SYSTEM_CLOCK.now())
            if out:
                checkpoint_write(doc, out)
            else:
                self.stdout.write(json.dumps(doc, separators=(",", ":")))
        except (AuditKeyError, CheckpointRefused, OSError) as exc:
            raise CommandError(str(exc)) from None
        if out:
            self.stderr.write(f"checkpoint #{doc['checkpoint']}: {doc['runs']} runs, global "
                              f"chain at #{doc['creations_seq']}, written to {out}")
