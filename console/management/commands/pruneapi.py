"""``manage.py pruneapi``: remove old Idempotency-Key answers and long-unused API tokens
(docs/operations/retention.md)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.retention import idempotency_prune, retention_cutoff, tokens_prune
from runtime.clock import SYSTEM_CLOCK
from runtime.conf import ConfigError
from runtime.retention.dates import parse_before


class Command(BaseCommand):
    help = ("Remove the JSON API's kept answers to Idempotency-Key requests made before DATE, "
            "and API tokens not issued, used or revoked since DATE (defaults: "
            "CONSOLE_RETAIN_IDEMPOTENCY_DAYS and CONSOLE_RETAIN_API_TOKENS_DAYS ago, when "
            "set). Dates: 2026-01-31, an ISO time, or 90d.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--idempotency-before", metavar="DATE",
                            help="remove answers to requests made before this")
        parser.add_argument("--tokens-unused-since", metavar="DATE",
                            help="remove tokens with no issue, use or revocation since this")

    def handle(self, *args: Any, **opts: Any) -> None:
        now = SYSTEM_CLOCK.now()
        try:
            answers = (parse_before(opts["idempotency_before"], now)
                       if opts["idempotency_before"] is not None
                       else retention_cutoff("CONSOLE_RETAIN_IDEMPOTENCY_DAYS", now))
            tokens = (parse_before(opts["tokens_unused_since"], now)
                      if opts["tokens_unused_since"] is not None
                      else retention_cutoff("CONSOLE_RETAIN_API_TOKENS_DAYS", now))
        except (ValueError, ConfigError) as exc:
            raise CommandError(str(exc)) from None
        if answers is None and tokens is None:
            raise CommandError("nothing to prune: give --idempotency-before DATE or "
                               "--tokens-unused-since DATE, or set "
                               "CONSOLE_RETAIN_IDEMPOTENCY_DAYS or CONSOLE_RETAIN_API_TOKENS_DAYS")
        for name, at in (("--idempotency-before", answers), ("--tokens-unused-since", tokens)):
            if at is not None and at > now:
                raise CommandError(f"{name} {at.isoformat()} is in the future")
        if answers is not None:
            count = idempotency_prune(before=answers, now=now)
            self.stdout.write(f"idempotency answers: {count} removed (requests before "
                              f"{answers.isoformat()})")
        if tokens is not None:
            count = tokens_prune(unused_since=tokens)
            self.stdout.write(f"API tokens: {count} removed (unused since "
                              f"{tokens.isoformat()})")
