"""``manage.py runagent AGENT --input JSON``: one run in the foreground, its events printed."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runtime.api import resume, start
from runtime.errors import AgentRuntimeError, InvalidPayload, UnknownAgent
from runtime.models import RunStatus


class _Printer(logging.Handler):
    def __init__(self, stream: Any) -> None:
        super().__init__(logging.INFO)
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        self.stream.write(record.getMessage() + "\n")
        self.stream.flush()


class Command(BaseCommand):
    help = "Start a run of AGENT with --input and execute it here, printing each event."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("agent")
        parser.add_argument("--input", default="null", help="the run's input, as JSON")
        parser.add_argument("--lease-seconds", type=float, default=None)
        parser.add_argument("--name", default="runagent", help="lease owner name")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            data = json.loads(options["input"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"--input is not valid JSON: {exc}") from None
        events = logging.getLogger("runtime.events")
        printer = _Printer(self.stdout)
        events.addHandler(printer)
        old_level, old_propagate = events.level, events.propagate
        events.setLevel(logging.INFO)
        events.propagate = False
        try:
            run = start(options["agent"], data, created_by="runagent")
            run = resume(run.pk, name=options["name"], lease_seconds=options["lease_seconds"])
        except (UnknownAgent, InvalidPayload) as exc:
            raise CommandError(str(exc)) from None
        except AgentRuntimeError as exc:
            raise CommandError(f"{type(exc).__name__}: {exc}") from None
        finally:
            events.removeHandler(printer)
            events.setLevel(old_level)
            events.propagate = old_propagate
        summary = f"run {run.pk}: {run.status}"
        if run.status == RunStatus.SUCCEEDED:
            self.stdout.write(f"{summary} output={json.dumps(run.output)}")
            return
        if run.status == RunStatus.WAITING:
            self.stdout.write(f"{summary} (an approval is pending)")
            sys.exit(3)
        self.stdout.write(f"{summary} {run.failure_code}: {run.failure_message}")
        sys.exit(2)
