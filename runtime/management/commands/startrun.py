"""``manage.py startrun AGENT --input JSON [--wait]``: queue a run for the workers."""

from __future__ import annotations

import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runtime.canonical import parse_json
from runtime.errors import InvalidPayload, UnknownAgent
from runtime.loop.control import start
from runtime.management.commands.runagent import exit_with_outcome
from runtime.models import TERMINAL_RUN_STATUSES, Approval, ApprovalStatus, RunStatus
from runtime.notifications.channels import approval_link


class Command(BaseCommand):
    help = ("Queue a run of AGENT with --input (JSON) for the workers and print its id. With "
            "--wait, wait until it ends or waits for a person: exit 0 succeeded, 2 failed or "
            "cancelled, 3 waiting for a person, 4 still going after --timeout.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("agent")
        parser.add_argument("--input", default="{}", help="the run's input, as JSON")
        parser.add_argument("--by", default="startrun", help="who started it (audit log)")
        parser.add_argument("--wait", action="store_true")
        parser.add_argument("--timeout", type=float, default=600.0, help="seconds, with --wait")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            data = parse_json("--input", opts["input"])
        except InvalidPayload as exc:
            raise CommandError(str(exc)) from None
        except ValueError as exc:
            raise CommandError(f"--input is not valid JSON: {exc}") from None
        try:
            run = start(opts["agent"], data, created_by=opts["by"])
        except (UnknownAgent, InvalidPayload) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"run {run.pk} queued ({run.agent})")
        if not opts["wait"]:
            return
        deadline = time.monotonic() + opts["timeout"]
        while True:
            run.refresh_from_db()
            if run.status in TERMINAL_RUN_STATUSES or run.status == RunStatus.WAITING:
                break
            if time.monotonic() > deadline:
                self.stdout.write(f"run {run.pk}: still {run.status} after {opts['timeout']}s")
                sys.exit(4)
            time.sleep(0.1)  # polling the database for the run's state, bounded
        if run.status == RunStatus.WAITING:
            for approval in Approval.objects.filter(
                    run=run, status=ApprovalStatus.PENDING).order_by("pk"):
                self.stdout.write(f"run {run.pk}: approval {approval.pk} waits for a person "
                                  f"({approval.title}): {approval_link(approval.pk)}")
        exit_with_outcome(self.stdout, run)
