"""``manage.py runagent AGENT --input JSON``: one run in the foreground, its events printed.

``runagent --resume RUN_ID`` executes an existing run here instead (claim it, or take it over
once its lease has expired); a run whose lease is live is refused, exit status 1.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runtime import crashpoints
from runtime.canonical import parse_json
from runtime.errors import AgentRuntimeError, InvalidPayload, UnknownAgent
from runtime.loop.control import resume, start
from runtime.models import Run, RunStatus


def exit_with_outcome(out: Any, run: Run) -> None:
    """Print how the run stands; exit 0 succeeded, 3 waiting for a person, 2 otherwise."""
    summary = f"run {run.pk}: {run.status}"
    if run.status == RunStatus.SUCCEEDED:
        out.write(f"{summary} output={json.dumps(run.output)}")
        return
    if run.status == RunStatus.WAITING:
        out.write(f"{summary} (waiting for a person: see the console)")
        sys.exit(3)
    out.write(f"{summary} {run.failure_code}: {run.failure_message}")
    sys.exit(2)


class _Printer(logging.Handler):
    def __init__(self, stream: Any) -> None:
        super().__init__(logging.INFO)
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        self.stream.write(record.getMessage() + "\n")
        self.stream.flush()


class Command(BaseCommand):
    help = ("Start a run of AGENT with --input (or --resume an existing run) and execute it "
            "here, printing each event. Exit 0 succeeded, 2 failed, 3 waiting for a person.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("agent", nargs="?")
        parser.add_argument("--resume", type=int, metavar="RUN_ID",
                            help="execute this existing run instead of starting one")
        parser.add_argument("--input", default="null", help="the run's input, as JSON")
        parser.add_argument("--lease-seconds", type=float, default=None)
        parser.add_argument("--name", default="runagent", help="lease owner name")

    def handle(self, *args: Any, **options: Any) -> None:
        if (options["agent"] is None) == (options["resume"] is None):
            raise CommandError("give an AGENT to start, or --resume RUN_ID (not both)")
        try:
            data = parse_json("--input", options["input"])
        except InvalidPayload as exc:
            raise CommandError(str(exc)) from None
        except ValueError as exc:
            raise CommandError(f"--input is not valid JSON: {exc}") from None
        crashpoints.arm_from_env()  # the crash test kit arms this process through its env
        events = logging.getLogger("runtime.events")
        printer = _Printer(self.stdout)
        events.addHandler(printer)
        old_level, old_propagate = events.level, events.propagate
        events.setLevel(logging.INFO)
        events.propagate = False
        try:
            run_id = options["resume"]
            if run_id is None:
                run_id = start(options["agent"], data, created_by="runagent").pk
            run = resume(run_id, name=options["name"], lease_seconds=options["lease_seconds"])
        except (UnknownAgent, InvalidPayload) as exc:
            raise CommandError(str(exc)) from None
        except AgentRuntimeError as exc:
            raise CommandError(f"{type(exc).__name__}: {exc}") from None
        finally:
            events.removeHandler(printer)
            events.setLevel(old_level)
            events.propagate = old_propagate
        exit_with_outcome(self.stdout, run)
