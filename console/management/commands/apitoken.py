"""``manage.py apitoken create USER --name N`` (prints the token once), ``apitoken revoke ID``,
``apitoken list``: API tokens without the admin."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.models import ApiToken


class Command(BaseCommand):
    help = "Create, revoke or list API tokens (only a token's hash is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="a new token for USER, printed once")
        create.add_argument("user")
        create.add_argument("--name", required=True, help="what the token is for")
        revoke = sub.add_parser("revoke", help="revoke the token with this id")
        revoke.add_argument("id", type=int)
        sub.add_parser("list", help="every token: id, user, name, created, last used, revoked")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "create":
            User = get_user_model()
            try:
                user = User.objects.get(**{User.USERNAME_FIELD: options["user"]})
            except User.DoesNotExist:
                raise CommandError(f"no user {options['user']!r}") from None
            row, token = ApiToken.issue(user, options["name"])
            self.stderr.write(f"token {row.pk} for {user} ({row.name}); it is shown only now:")
            self.stdout.write(token)
        elif action == "revoke":
            found = ApiToken.objects.filter(pk=options["id"]).first()
            if found is None:
                raise CommandError(f"no token {options['id']}")
            found.revoke()
            assert found.revoked_at is not None, "revoke() sets it (or it was set)"
            self.stdout.write(f"token {found.pk} revoked at {found.revoked_at.isoformat()}")
        else:
            for row in ApiToken.objects.select_related("user").order_by("pk"):
                self.stdout.write("\t".join([
                    str(row.pk), row.user.get_username(), row.name, row.created_at.isoformat(),
                    row.last_used_at.isoformat() if row.last_used_at else "-",
                    f"revoked {row.revoked_at.isoformat()}" if row.revoked_at else "active"]))
