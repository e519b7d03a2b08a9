"""``manage.py schedule list|add|remove|enable|disable|authorize|unauthorize``."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runtime.canonical import dumps, parse_json
from runtime.clock import SYSTEM_CLOCK
from runtime.errors import InvalidPayload, InvalidSchedule, ScheduleNotFound
from runtime.models import Schedule
from runtime.schedules.changes import (
    schedule_authorize,
    schedule_create,
    schedule_remove,
    schedule_set_enabled,
)


class Command(BaseCommand):
    help = ("List, add and remove schedules (runs of an agent on a cron expression or an "
            "interval), enable or disable them, and turn their standing authorization of side "
            "effects on or off. Every change is recorded with --by (default: this OS user).")

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="every schedule, with its next fire time")
        add = sub.add_parser("add", help="a new schedule")
        add.add_argument("name")
        add.add_argument("agent")
        add.add_argument("--input", default="{}", help="the runs' input, as JSON")
        when = add.add_mutually_exclusive_group(required=True)
        when.add_argument("--cron", help='five fields ("*/15 * * * *") or @hourly, @daily, …')
        when.add_argument("--every", type=int, metavar="SECONDS", help="a fixed interval")
        add.add_argument("--timezone", default="UTC", help="the cron's time zone (default UTC)")
        add.add_argument("--disabled", action="store_true", help="create it disabled")
        for action in ("remove", "enable", "disable", "unauthorize"):
            sub.add_parser(action).add_argument("name")
        auth = sub.add_parser("authorize", help="let policy approvals of its runs be granted "
                              "without a person (never interrupted side effects)")
        auth.add_argument("name")
        auth.add_argument("--confirm", action="store_true",
                          help="yes: I authorize these side effects ahead of time")
        for p in sub.choices.values():
            p.add_argument("--by", default="", help="who makes the change")

    def handle(self, *args: Any, action: str, **opts: Any) -> None:
        by = opts.get("by") or getpass.getuser()
        now = SYSTEM_CLOCK.now()
        try:
            if action == "list":
                self._list()
            elif action == "add":
                self._add(opts, by, now)
            else:
                self._change(action, opts, by, now)
        except (InvalidSchedule, ScheduleNotFound) as exc:
            raise CommandError(str(exc)) from None

    def _list(self) -> None:
        rows = Schedule.objects.filter(removed_at__isnull=True).order_by("name")
        for s in rows:
            when = f"{s.cron} ({s.timezone})" if s.cron else f"every {s.interval_seconds}s"
            state = "enabled" if s.enabled else "disabled"
            nxt, auth = "-", "asks a person"
            if s.enabled:
                assert s.next_fire_at is not None, "every change of a schedule sets it"
                nxt = s.next_fire_at.isoformat(timespec="seconds")
            if s.authorize_side_effects:
                assert s.authorized_at is not None, "set with the authorization"
                auth = (f"side effects authorized by {s.authorized_by} at "
                        f"{s.authorized_at.isoformat(timespec='seconds')}")
            self.stdout.write(f"{s.name}\t{s.agent}\t{when}\t{state}\tnext {nxt}\t{auth}")
        if not rows:
            self.stdout.write("no schedules")

    def _add(self, opts: dict[str, Any], by: str, now: Any) -> None:
        try:
            data = parse_json("--input", opts["input"])
        except InvalidPayload as exc:
            raise CommandError(str(exc)) from None
        except ValueError as exc:
            raise CommandError(f"--input is not valid JSON: {exc}") from None
        s = schedule_create(opts["name"], opts["agent"], data, by=by, now=now,
                            cron=opts["cron"] or "", interval_seconds=opts["every"],
                            timezone=opts["timezone"], enabled=not opts["disabled"])
        assert s.next_fire_at is not None, "schedule_create sets it"
        self.stdout.write(f"schedule {s.name} (id {s.pk}): next run at "
                          f"{s.next_fire_at.isoformat(timespec='seconds')}, input {dumps(s.input)}")

    def _change(self, action: str, opts: dict[str, Any], by: str, now: Any) -> None:
        s = Schedule.objects.filter(name=opts["name"], removed_at__isnull=True).first()
        if s is None:
            raise CommandError(f"no schedule named {opts['name']!r}")
        if action == "remove":
            schedule_remove(s.pk, by=by, now=now)
        elif action in ("enable", "disable"):
            schedule_set_enabled(s.pk, action == "enable", by=by, now=now)
        elif action == "unauthorize":
            schedule_authorize(s.pk, False, by=by, now=now)
        else:
            if not opts["confirm"]:
                raise CommandError(
                    f"this lets every run that schedule {s.name} fires from now on start the "
                    f"side effects agent {s.agent}'s policy would ask a person about, without "
                    "asking (never a call whose outcome is uncertain); add --confirm to do it")
            schedule_authorize(s.pk, True, by=by, now=now)
        self.stdout.write(f"schedule {s.name}: {action}d")
